"""New-user mistakes typed on the command line: each stops with one ``error:`` line, no traceback,
and leaves every file as it was.

Each row is the command line a user types, run in-process through the real entry point in a
folder that holds what the mistakes point at (a drafter folder, another drafter's eval report,
a binary, an empty and a BOM-marked prompt file); the folder is compared before and after.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from draftheads.conf.cli import main, parse
from draftheads.conf.errors import UserError
from tests.test_bad_input import one_line_error, snapshot

BOM = b"\xef\xbb\xbf"


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working folder with a drafter folder ``h`` (and its report on ``a/ok.jsonl``), another
    drafter's report in ``report/`` and the prompt files the rows name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text("{}")
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.json").write_text(json.dumps({"tau": 2.1, "heads": "outputs/other"}))
    (report / "report.md").write_text("# other drafter\n")
    (report / "turns.jsonl").write_text('{"tau": 2.1}\n')
    (tmp_path / "hello.txt").write_text("Hello")
    (tmp_path / "bom.txt").write_bytes(BOM + b"Hello")
    (tmp_path / "empty.txt").write_text(" \n")
    (tmp_path / "bin.txt").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    (tmp_path / "a-file").write_text("keep me")
    for folder in ("a", "b"):  # two prompt files of one name, and the report on the first
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ok.jsonl").write_text('{"text": "Hello"}\n')
    (tmp_path / "garbage").mkdir()  # a download that is no torch file
    (tmp_path / "garbage" / "pytorch_model.bin").write_bytes(b"garbage\n")
    (tmp_path / "h" / "eval-ok").mkdir()
    (tmp_path / "h" / "eval-ok" / "report.json").write_text(
        json.dumps({"tau": 2, "heads": "h", "prompts": "a/ok.jsonl"})
    )
    return tmp_path


# (argv, a part of the one line it prints); every row also runs on target=tiny-llama.
REFUSED = [
    # another drafter's report is never replaced
    (["eval", "heads=h", "eval.out_dir=report"], "eval.out_dir=report holds the report of heads=outputs/other"),
    # nor a report on other prompts, though their file has the same name
    (["eval", "heads=h", "eval.prompts=b/ok.jsonl"], "h/eval-ok (the default eval.out_dir) holds the report on eval.prompts=a/ok.jsonl"),
    (["eval", "heads=h", "eval.prompts=b/ok.jsonl", "eval.out_dir=h/eval-ok"], "this run on eval.prompts=b/ok.jsonl"),
    # eval's prompt files are named by eval.prompts, not the data.path they are read through
    (["eval", "heads=h", "eval.prompts=empty.txt"], "eval.prompts=empty.txt"),
    (["eval", "heads=h", "eval.prompts=hello.txt"], "eval.prompts=hello.txt: unsupported file type '.txt'"),
    (["eval", "heads=h", "eval.prompts=a-file"], "eval.prompts=a-file"),
    # a verify-cost cache that cannot be written
    (["generate", "heads=h", "prompt=hi", "decode.cost_cache=/proc/x"], "decode.cost_cache=/proc/x cannot be written"),
    (["generate", "heads=h", "prompt=hi", "decode.cost_cache=a-file"], "decode.cost_cache=a-file is an existing file"),
    (["eval", "heads=h", "decode.cost_cache=a-file/c"], "a-file is a file, so the directory cannot be created"),
    (["speed", "heads=h", "decode.cost_cache=/proc/x"], "decode.cost_cache=/proc/x cannot be written"),
    # a number is not a boolean
    (["generate", "heads=h", "prompt=hi", "decode.cost_aware=2"], "decode.cost_aware=2 is not a boolean"),
    (["eval", "heads=h", "decode.lookup=5"], "decode.lookup=5 is not a boolean"),
    (["speed", "heads=h", "speed.curve=2"], "speed.curve=2 is not a boolean"),
    # one prompt, from one place
    (["generate", "heads=h", "prompt=Hello", "prompt_file=hello.txt"], "prompt and prompt_file both give the prompt"),
    (["generate", "heads=h", "prompt_file=hello.txt", "prompt_file=bom.txt"], "prompt_file is given 2 times"),
    # baselines once each
    (["eval", "heads=h", "eval.baselines=[pld,pld]"], "eval.baselines=['pld', 'pld'] names pld twice"),
    # a feature cache is read only offline
    (["train", "train.feature_cache=h"], "train.feature_cache=h is read only with train.features=offline"),
    # Medusa has no decoder layers to start from the target's
    (["train", "draft=medusa", "draft.eagle.init_from_target=true"], "draft.eagle.init_from_target=true is a key of eagle drafters, and draft.kind=medusa does not read it; drop it"),
    (
        ["train", "draft=eagle", "draft.eagle.num_decoder_layers=5", "draft.eagle.init_from_target=true", "train.out_dir=run",
         "data.max_rows=4", "train.max_steps=1", "train.eval_every=0"],
        "draft.eagle.num_decoder_layers=5 with draft.eagle.init_from_target=true: the target has only 4 layers",
    ),
    (
        ["train", "draft=eagle3", "draft.eagle.num_decoder_layers=5", "train.out_dir=run", "data.max_rows=4",
         "train.max_steps=1", "train.eval_every=0"],
        "draft.eagle.num_decoder_layers=5 is more than the target's 4 layers",
    ),
    # a DFlash block no answer holds, and a mask token text produces
    (
        ["train", "draft=dflash", "draft.dflash.block_size=600", "train.out_dir=run", "data.max_rows=4",
         "data.max_length=64", "train.max_steps=1", "train.eval_every=0"],
        "draft.dflash.block_size=600 is longer than the longest answer in the training rows",
    ),
    (
        ["train", "draft=dflash", "draft.dflash.mask_token_id=100", "train.out_dir=run", "data.max_rows=4",
         "train.max_steps=1", "train.eval_every=0"],
        "draft.dflash.mask_token_id=100 is the ordinary text token",
    ),
    # generate and eval decode one prompt at a time
    (["generate", "heads=h", "prompt=hi", "decode.batch_size=4"], "decode.batch_size=4: generate decodes one prompt"),
    (["eval", "heads=h", "decode.batch_size=2"], "decode.batch_size=2: eval decodes one prompt"),
    # without a drafter only lookup drafts, so it cannot be off
    (["generate", "heads=none", "prompt=Hi", "decode.lookup_tokens=0"], "heads=none with decode.lookup_tokens=0: there is no drafter"),
    (["eval", "heads=none", "decode.lookup=false"], "heads=none with decode.lookup=false: there is no drafter"),
    (["speed", "heads=none", "decode.lookup=false"], "prompt lookup is off, so nothing proposes drafts"),
    # tree writes a tree, it reads none
    (["tree", "heads=h", "decode.tree=chain"], "tree picks a new tree and does not read decode.tree"),
    # prompt files that hold no text
    (["generate", "heads=h", "prompt_file=bin.txt"], "prompt_file=bin.txt is not UTF-8 text"),
    (["generate", "heads=h", "prompt_file=/proc/self/mem"], "prompt_file=/proc/self/mem cannot be read"),
    (["generate", "heads=h", "prompt_file=empty.txt"], "prompt_file=empty.txt is empty"),
    (["generate", "heads=h", "prompt_file=missing.txt"], "prompt_file=missing.txt: no such file"),
    # an assistant model that is not there
    (["eval", "heads=h", "eval.assistant_model=smollm2"], "eval.assistant_model=smollm2: no folder"),
    (["eval", "heads=h", "eval.assistant_model=./models/x"], "eval.assistant_model=./models/x: no folder"),
    (["eval", "heads=h", "eval.assistant_model=report"], "eval.assistant_model=report is a folder without config.json"),
    # the distillation backend is checked with the other keys
    (["distill", "data.distill.backend=onednnn"], "data.distill.backend=onednnn is unknown; use one of auto"),
    (["distill", "decode.backend=onednnn"], "distill runs the target on data.distill.backend"),
    (["distill", "data.distill.heads=./nope"], "data.distill.heads=./nope: no such folder, and not a hub id"),
    # generation settings that name no tree or stop at once, and an offload folder that cannot be written
    (["generate", "heads=h", "prompt=hi", "decode.tree=chain0"], "decode.tree=chain0 is unknown; use one of auto, chain"),
    (["generate", "heads=h", "prompt=hi", "decode.tree=chainsaw"], "decode.tree=chainsaw is unknown"),
    (["generate", "heads=h", "prompt=hi", "decode.tree=[[0],[5,5]]"], "has [5, 5] without its parent [5]"),
    (["generate", "heads=h", "prompt=hi", "decode.tree=[[0],[0]]"], "decode.tree=[[0],[0]] lists a path twice"),
    (["eval", "heads=h", "decode.tree=[[0"], "decode.tree=[[0 is not valid JSON"),
    (["eval", "heads=h", "decode.tree=tree.jsn"], "decode.tree=tree.jsn names no tree and no file"),
    (["generate", "heads=h", "prompt=hi", "decode=greedy", "decode.top_p=0.9"], "decode.top_p=0.9 shapes sampling, but decode.do_sample=false"),
    (["eval", "heads=h", "decode=sample", "decode.do_sample=false"], "decode.temperature=0.7 shapes sampling"),
    (["generate", "heads=h", "prompt=hi", "decode.stop=['']"], "has an empty string, which would stop at once"),
    (
        ["generate", "heads=h", "prompt=hi", "target.device_map=auto", "target.offload_folder=a-file"],
        "target.offload_folder=a-file is an existing file",
    ),
    (["train", "target.device_map=auto", "target.offload_folder=/proc/x"], "target.offload_folder=/proc/x cannot be written"),
    # an attention implementation that does not exist
    (["generate", "heads=h", "prompt=hi", "target.attn_implementation=sdpaa"], "target.attn_implementation=sdpaa is unknown"),
    # a mapping typed unquoted in bash arrives as one override per item
    (
        ["generate", "heads=h", "prompt=hi", "target.device_map=model.embed_tokens:0", "target.device_map=model.layers:0",
         "target.device_map=model.norm:1", "target.device_map=lm_head:1"],
        "the shell expanded an unquoted {...} into one override per item; quote the mapping: "
        "'target.device_map={model.embed_tokens:0,model.layers:0,model.norm:1,lm_head:1}'",
    ),
    (
        ["eval", "heads=h", "target.device_map=auto", "target.max_memory=0:70GiB", "target.max_memory=cpu:100GiB"],
        "quote the mapping: 'target.max_memory={0:70GiB,cpu:100GiB}'",
    ),
    # NaN and infinity are no numbers, whatever range check follows
    (["train", "draft=dflash", "draft.dflash.anchor_prior=nan"], "draft.dflash.anchor_prior=nan is not a finite number"),
    (["train", "train.grad_clip=nan"], "train.grad_clip=nan is not a finite number"),
    (["train", "train.weight_decay=nan"], "train.weight_decay=nan is not a finite number"),
    (["generate", "heads=h", "prompt=hi", "decode.temperature=inf"], "decode.temperature=inf is not a finite number"),
    (["generate", "heads=h", "prompt=hi", "decode=typical", "decode.typical_epsilon=nan"], "decode.typical_epsilon=nan is not"),
    (["train", "draft=dflash", "draft.dflash.loss_gamma=nan"], "draft.dflash.loss_gamma=nan is not a finite number"),
    (["train", "draft=dflash", "draft.dflash.qk_gain=nan"], "draft.dflash.qk_gain=nan is not a finite number"),
    (["train", "draft=eagle", "draft.eagle.feature_noise=nan"], "draft.eagle.feature_noise=nan is not a finite number"),
    (["train", "train.betas=[0.9,nan]"], "train.betas[1]=nan is not a finite number"),
    # the deepspeed group is DeepSpeed's own config: a key its file lacks is added with +
    (["train", "deepspeed=zero3", "deepspeed.zero_optimization.offload_optimizer.device=cpu"],
     "add a DeepSpeed key with +deepspeed.zero_optimization.offload_optimizer.device=cpu"),
    # another kind's keys are not read, so they are refused naming the key this kind reads
    (["train", "draft=dflash", "draft.medusa.num_layers=3"], "draft.kind=dflash does not read it; use draft.dflash.num_decoder_layers=3"),
    (["train", "draft=medusa", "draft.eagle.num_decoder_layers=2"], "draft.kind=medusa does not read it; use draft.medusa.num_layers=2"),
    (["train", "draft=eagle3", "draft.dflash.block_size=8"], "draft.dflash.block_size=8 is a key of dflash drafters"),
    (["train", "draft=dflash", "draft.eagle.ttt_steps=3"], "drop it (draft=eagle or draft=eagle3 reads it)"),
    # P-EAGLE's keys
    (["train", "draft=peagle", "draft.peagle.down_sample_ratio=0.2", "draft.peagle.down_sample_ratio_min=0.5"],
     "draft.peagle.down_sample_ratio_min=0.5 is above draft.peagle.down_sample_ratio=0.2"),
    (["train", "draft=peagle", "draft.peagle.init_from_eagle3=missing_dir", "train.out_dir=run", "data.max_rows=4",
      "train.max_steps=1", "train.eval_every=0"], "draft.peagle.init_from_eagle3=missing_dir: no such checkpoint directory"),
    # folders that hold no drafter: named without Python advice, nor torch's
    (["info", "heads=h"], "give a folder `draftheads train` wrote"),
    (["info", "heads=garbage"], "cannot read it as a weights-only torch checkpoint (Unsupported operand"),
    # speed's batches and settings
    (["speed", "heads=h", "speed.batch_sizes=[2,2]"], "speed.batch_sizes=[2, 2] lists a batch size twice"),
    (["speed", "heads=h", "speed.dynamic=[4,4,8]"], "put each entry in its own brackets: 'speed.dynamic=[[4,4,8]]'"),
    (["speed", "heads=h", "speed.dynamic=[[4,4]]"], "speed.dynamic entry [4, 4]: give [top_k_draft,depth,total_tokens]"),
    (["speed", "heads=h", "speed.batch_sizes=[0]"], "speed.batch_sizes=[0] needs batch sizes >= 1"),
    (["speed", "heads=h", "speed.batch_sizes=[16]"], "use speed.prompts=16 or speed.batch_sizes=[8]"),
    # the workload rows of speed
    (["speed", "heads=h", "speed.workloads=true", "speed.temperatures=[nan]"], "speed.temperatures[0]=nan is not a finite"),
    (["speed", "heads=h", "speed.workloads=true", "speed.temperatures=[0]"], "speed.temperatures has 0.0"),
    (["speed", "heads=h", "speed.workloads=true", "speed.long_prompts=0"], "speed.long_prompts=0 is out of range"),
    (["speed", "heads=h", "speed.workloads=true", "speed.sampling_sets=[heldot]"], "speed.sampling_sets=heldot is unknown"),
    (["speed", "heads=h", "speed.workloads=true", "speed.figures="], "speed.figures is empty"),
    (["speed", "heads=h", "speed.workloads=true", "speed.figures=hello.txt"], "speed.figures=hello.txt is not a .json file"),
    (["speed", "heads=h", "speed.workloads=true", "speed.figures=report/report.json"], "was not written by draftheads bench"),
    (["speed", "heads=h", "speed.figures=x.json"], "speed.figures is written by the workload rows"),
    # the study's rows: an unknown one is named with the rows, not sent on to the study
    (["bench", "bench.ablations=[nonsense row]"], "bench.ablations: unknown rows ['nonsense row']; use all or some of ['eagle3', "),
]  # fmt: skip


@pytest.mark.parametrize("argv,needle", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_mistake_stops_with_one_line_and_changes_nothing(workdir, capsys, argv, needle):
    before = snapshot(workdir)
    assert main([*argv, "target=tiny-llama"]) == 1
    line = one_line_error(capsys)
    assert needle in line and (argv[0] != "eval" or "data.path" not in line), line
    assert "from_pretrained(" not in line and "weights_only` set to `False`" not in line, line
    assert snapshot(workdir) == before


def test_help_of_tree_does_not_list_decode_tree(capsys):
    assert main(["tree", "--help"]) == 0
    keys = [line.split(" = ")[0].strip() for line in capsys.readouterr().out.splitlines()]
    assert "decode.tree" not in keys and "decode.tree_size" in keys


@pytest.mark.parametrize("word", ["true", "false", "1", "0"])
def test_boolean_words_are_still_taken(word):
    assert parse(
        ["generate", "heads=h", "prompt=hi", f"decode.cost_aware={word}"]
    ).args.decode.cost_aware == (word in ("true", "1"))


def test_a_sampling_set_may_be_a_prompt_file_as_the_absent_set_advises(workdir):
    argv = ["speed", "heads=h", "speed.workloads=true", "speed.sampling_sets=[heldout,a/ok.jsonl]"]
    assert parse(argv).args.speed.sampling_sets == ["heldout", "a/ok.jsonl"]


def test_a_prompt_file_saved_with_a_bom_reads_as_its_text(workdir):
    with_bom = parse(["generate", "heads=h", "prompt_file=bom.txt"]).args.prompt
    assert with_bom == parse(["generate", "heads=h", "prompt_file=hello.txt"]).args.prompt == "Hello"


def test_a_data_file_saved_with_a_bom_keeps_its_first_row(workdir, capsys):
    rows = [
        {"messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": "A"}]}
        for i in range(2)
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (workdir / "bom.jsonl").write_bytes(BOM + text.encode())
    assert main(["data", "data.path=bom.jsonl", "target=tiny-llama"]) == 0
    out = capsys.readouterr()
    assert "BOM" not in out.err and "utf-8-sig" not in out.err and "skipped" not in out.err


def test_the_same_drafter_may_refresh_its_report(workdir):
    from draftheads.conf.commands.decode import check_report_owner

    (workdir / "report" / "report.json").write_text(json.dumps({"tau": 2.1, "heads": "h"}))
    check_report_owner(workdir / "report", "./h")  # the same folder, spelt otherwise
    with pytest.raises(UserError, match="holds the report of heads=h"):
        check_report_owner(workdir / "report", "none")
    check_report_owner(workdir / "h" / "eval-ok", "h", "./a/ok.jsonl")  # the same prompt file


@pytest.mark.parametrize(
    "edit,why",
    [
        (lambda d: d.update(seconds=[-t for t in d["seconds"]]), "finite and positive"),
        (lambda d: d.update(seconds=[math.nan] * len(d["seconds"])), "finite and positive"),
        (lambda d: d.update(seconds=d["seconds"][::-1]), "seconds fall"),
        (lambda d: d.update(sizes=d["sizes"][:2]), "two lists of one length"),
        (lambda d: d.update(sizes=sorted(d["sizes"], reverse=True)), "sizes do not increase"),
    ],
)
def test_a_corrupted_cost_curve_is_measured_again_and_said(tmp_path, tiny_llama, capsys, edit, why):
    from draftheads.decode.cost_cache import cached_curve, curve_problem

    model, _, _ = tiny_llama
    good = cached_curve(model, "eager", tmp_path)
    assert curve_problem(good.sizes, good.seconds) is None
    (f,) = tmp_path.glob("*.json")
    data = json.loads(f.read_text())
    edit(data)
    f.write_text(json.dumps(data))
    capsys.readouterr()
    again = cached_curve(model, "eager", tmp_path)
    assert why in capsys.readouterr().err
    assert curve_problem(again.sizes, again.seconds) is None and all(t > 0 for t in again.seconds)
    assert curve_problem(*(json.loads(f.read_text())[k] for k in ("sizes", "seconds"))) is None


def test_an_unwritable_cost_cache_is_said_to_python_callers(tiny_llama, capsys):
    from draftheads.decode.cost_cache import cached_curve

    model, _, _ = tiny_llama
    cached_curve(model, "eager", "/proc/draftheads-cost")
    assert "cannot be cached in /proc/draftheads-cost" in capsys.readouterr().err


def test_generate_measures_a_corrupted_cost_curve_again_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["generate", "heads=none", "target=tiny-llama", "prompt=hi", "decode.max_new_tokens=2"]
    assert main([*argv, "decode.cost_cache=cc"]) == 0
    (f,) = [
        c for c in (tmp_path / "cc").glob("*.json") if not c.name.startswith("backend-")
    ]  # the cost curve
    data = json.loads(f.read_text())
    f.write_text(json.dumps({**data, "seconds": [-1.0] + data["seconds"][1:]}))
    capsys.readouterr()
    assert main([*argv, "decode.cost_cache=cc"]) == 0
    assert (
        f"the verify-cost curve {Path('cc') / f.name} is unusable (seconds are not all finite"
        in capsys.readouterr().err
    )
    assert all(t > 0 for t in json.loads(f.read_text())["seconds"])


def float_keys(kind: type, prefix: str) -> list[str]:
    """Every dotted key under dataclass ``kind`` that holds a float or a list of floats."""
    import dataclasses
    import typing

    keys = []
    for name, hint in typing.get_type_hints(kind).items():
        key = f"{prefix}{name}"
        hint = next(
            (a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), hint
        )  # a draft section
        if dataclasses.is_dataclass(hint):
            keys += float_keys(hint, f"{key}.")
        elif hint in (float, float | None) or float in typing.get_args(hint):
            keys.append(key)
    return keys


def test_every_float_of_the_schema_refuses_nan_and_infinity_in_one_line():
    """The one check walks the composed config as plain containers (the table above runs it through
    the command line): every float key of the schema, and a float inside a list, is named."""
    import dataclasses

    from draftheads.conf.schema import Config
    from draftheads.conf.schema.checks import finite
    from draftheads.conf.schema.heads import DraftConfig

    keys = float_keys(Config, "")
    assert {
        "draft.dflash.anchor_prior",
        "train.weight_decay",
        "decode.temperature",
        "eval.temperatures",
    } <= set(keys)
    for key in keys:
        for number in (math.nan, -math.inf):
            *parents, leaf = key.split(".")
            # a draft key is read in its kind's section, set when that kind is chosen
            draft = DraftConfig(kind=parents[1]) if parents[0] == "draft" else DraftConfig()
            tree = dataclasses.asdict(Config(draft=draft))
            node = tree
            for part in parents:
                node = node[part]
            is_list = isinstance(node[leaf], (list, tuple))
            node[leaf] = [0.5, number] if is_list else number
            with pytest.raises(UserError) as e:
                finite(tree, root=Config)
            named = f"{key}[1]" if is_list else key
            assert str(e.value).startswith(f"{named}={number} is not a finite number"), str(e.value)
    finite(dataclasses.asdict(Config()), root=Config)  # the defaults pass


def test_python_callers_of_training_get_the_finite_check():
    from draftheads.conf.schema import Config
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.conf.schema.train import validate

    with pytest.raises(UserError, match=r"draft.dflash.anchor_prior=nan is not a finite number"):
        validate(Config(draft=DraftConfig.of(kind="dflash", anchor_prior=math.nan)))


@pytest.fixture
def target_folder(tmp_path, monkeypatch, tiny_llama) -> Path:
    """A working folder holding ``target/``: tiny-llama saved as a model folder."""
    model, tok, _ = tiny_llama
    monkeypatch.chdir(tmp_path)
    model.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    return tmp_path


def test_a_target_generation_config_that_is_no_json_is_named(target_folder, capsys):
    argv = ["generate", "heads=none", "target.name_or_path=target", "prompt=hi", "decode.max_new_tokens=2"]
    (target_folder / "target" / "generation_config.json").write_text('{"do_sample": true,')
    assert main(argv) == 1
    line = one_line_error(capsys)
    assert "generation_config.json is not valid JSON" in line and "fix the file" in line, line


def test_beam_search_from_the_targets_generation_config_says_where_and_how(target_folder, capsys):
    argv = ["generate", "heads=none", "target.name_or_path=target", "prompt=hi", "decode.max_new_tokens=2"]
    (target_folder / "target" / "generation_config.json").write_text('{"num_beams": 4}')
    for command in (argv, ["speed", "heads=none", "target.name_or_path=target", "speed.batch_sizes=[1]"]):
        assert main(command) == 1
        line = one_line_error(capsys)
        assert f"target{__import__('os').sep}generation_config.json sets num_beams=4" in line, line
        assert "no command-line key overrides it: set num_beams=1 in that file" in line, line
    (target_folder / "target" / "generation_config.json").write_text('{"num_beams": 1}')
    assert main(argv) == 0


def test_the_quoted_mappings_the_brace_hint_names_are_read(capsys):
    for override in (
        "target.device_map={model.embed_tokens:0,model.layers:0,model.norm:1,lm_head:1}",
        "target.max_memory={0:70GiB,cpu:100GiB}",
    ):
        extra = ["target.device_map=auto"] if "max_memory" in override else []
        argv = ["generate", "heads=none", "prompt=hi", "target=tiny-llama", *extra, override, "--cfg", "job"]
        assert main(argv) == 0, capsys.readouterr().err


PAGE = (
    "<!DOCTYPE html><html><head><title>Welcome to nginx!</title><style>body{margin:0 auto;}</style></head>"
    "<body><h1>Welcome</h1>" + "<p>lorem ipsum dolor sit amet</p>" * 200 + "</body></html>"
)


@pytest.fixture
def html_server():
    """A real server on loopback that answers every request with an HTML page; yields a function
    that sets the status code and returns the /v1 URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    status = {"code": 404}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status["code"])
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(PAGE.encode())

        do_POST = do_GET

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for the serving loop's next poll: every 0.05 s, not the default 0.5 s
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    def url(code: int) -> str:
        status["code"] = code
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield url
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("code", [404, 200, 502])
def test_an_endpoint_answering_html_is_named_by_the_page_title(workdir, html_server, capsys, code):
    before = snapshot(workdir)
    argv = [
        "distill",
        f"data.distill.endpoint={html_server(code)}",
        "data.distill.retries=0",
        "data.max_rows=1",
    ]
    assert main([*argv, "data.distill.out_dir=d", "target=tiny-llama"]) == 1
    line = one_line_error(capsys)
    assert "an HTML page 'Welcome to nginx!'" in line and "<" not in line and len(line) < 300, line
    assert snapshot(workdir) == before
