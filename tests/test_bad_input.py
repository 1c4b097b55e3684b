"""Bad input to configs and the data layer: one line that names the key or file and the fix.

Config values are checked when the config is composed (the dataclasses' ``__post_init__``), so
a command stops before it loads a model or writes a file: the command-line tests compare a
snapshot of the working directory before and after.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from draftheads.conf.cli import compose, main
from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DataConfig, DistillConfig
from draftheads.conf.schema.decode import PROMPT_SETS, DecodeConfig
from draftheads.data.prepare import prepare_dataset
from draftheads.data.prompts import SHARED, load_prompts, prompts_from_config


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a hash of its content."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def one_line_error(capsys) -> str:
    """The single ``error: ...`` line a failed command printed on stderr."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    "override,needles",
    [
        ("decode.top_p=1.5", ["decode.top_p=1.5", "(0, 1]"]),
        ("decode.top_p=0", ["decode.top_p=0", "(0, 1]"]),
        ("decode.top_k=-5", ["decode.top_k=-5", ">= 0"]),
        ("decode.temperature=0", ["decode.temperature=0", "> 0", "decode.do_sample=false"]),
        ("decode.typical=true", ["decode.typical=true", "decode.do_sample=true"]),
        ("decode.max_new_tokens=0", ["decode.max_new_tokens=0", ">= 1"]),
        ("decode.batch_size=0", ["decode.batch_size=0", ">= 1"]),
        ("decode.tree_size=-1", ["decode.tree_size=-1", ">= 0"]),
        ("decode.tree_max_size=0", ["decode.tree_max_size=0", ">= 1"]),
        ("decode.tree_topk=0", ["decode.tree_topk=0", ">= 1"]),
        ("decode.tree_prompts=0", ["decode.tree_prompts=0", ">= 1"]),
        ("decode.tree_new_tokens=0", ["decode.tree_new_tokens=0", ">= 1"]),
        ("decode.top_k_draft=0", ["decode.top_k_draft=0", ">= 1"]),
        ("decode.depth=0", ["decode.depth=0", ">= 1"]),
        ("decode.total_tokens=1", ["decode.total_tokens=1", ">= 2"]),
        ("decode.backend=gpu", ["decode.backend=gpu", "auto, eager, onednn, cuda-graphs"]),
        ("decode.lookup_tokens=-1", ["decode.lookup_tokens=-1", ">= 0"]),
        ("decode.lookup_ngram=0", ["decode.lookup_ngram=0", ">= 1"]),
        ("decode.lookup_tokens=65", ["decode.lookup_tokens=65", "at most 64", "decode.lookup_tokens="]),
        ("decode.lookup_ngram=9", ["decode.lookup_ngram=9", "at most 8"]),
        ("eval.max_prompts=0", ["eval.max_prompts=0", ">= 1"]),
        ("eval.warmup=-1", ["eval.warmup=-1", ">= 0"]),
        ("eval.baselines=[pdl]", ["eval.baselines=pdl", "pld, assisted"]),
        ("eval.baselines=[assisted]", ["eval.assistant_model"]),
        ("eval.prompts=heldot", ["eval.prompts=heldot", ", ".join(PROMPT_SETS)]),
        ("eval.prompts=./missing.jsonl", ["eval.prompts=./missing.jsonl", "does not exist"]),
        ("eval.prompts=", ["eval.prompts is empty", ", ".join(PROMPT_SETS)]),
        ("data.heldout_fraction=1.5", ["data.heldout_fraction=1.5", "[0, 1)"]),
        ("data.heldout_fraction=-0.1", ["data.heldout_fraction=-0.1", "[0, 1)"]),
        ("data.max_length=1", ["data.max_length=1", ">= 2"]),
        ("data.max_rows=0", ["data.max_rows=0", ">= 1"]),
        ("data.format=xml", ["data.format=xml", "sharegpt"]),
        ("data.fields.txt=body", ["data.fields.txt", "did you mean data.fields.text"]),
        ("data.features.batch_tokens=0", ["data.features.batch_tokens=0", ">= 1"]),
        ("data.features.topk=-1", ["data.features.topk=-1", ">= 0"]),
        ("data.features.shard_mb=0", ["data.features.shard_mb=0", "> 0"]),
        ("data.features.dtype=int8", ["data.features.dtype=int8", "bfloat16"]),
        ("data.features.layers=[]", ["data.features.layers=[]"]),
        ("data.distill.batch_size=0", ["data.distill.batch_size=0", ">= 1"]),
        ("data.distill.shard_rows=0", ["data.distill.shard_rows=0", ">= 1"]),
        ("data.distill.max_new_tokens=0", ["data.distill.max_new_tokens=0", ">= 1"]),
        ("data.distill.self_prompts=0", ["data.distill.self_prompts=0", ">= 1"]),
        ("data.distill.top_p=2", ["data.distill.top_p=2", "(0, 1]"]),
        ("data.distill.temperature=-1", ["data.distill.temperature=-1", ">= 0"]),
        ("data.distill.source=web", ["data.distill.source=web", "data, self"]),
        ("data.mixture=[{path: a.jsonl, weight: 0}]", ["data.mixture[0].weight=0", "> 0"]),
        ("data.mixture=[{path: a.jsonl, wieght: 2}]", ["data.mixture[0] has unknown keys ['wieght']"]),
        ("data.mixture=[{path: a.jsonl}, {path: a.jsonl}]", ["same name"]),
        ("data.mixture=[{path: a.jsonl, heldout_fraction: 1}]", ["data.mixture[0].heldout_fraction=1"]),
    ],
)
def test_bad_config_values_stop_at_compose_with_one_line(override, needles):
    with pytest.raises(UserError) as e:
        compose([override])
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


@pytest.mark.parametrize(
    "group", ["decode=greedy", "decode=sample", "decode=typical", "data=broad", "data=self"]
)
def test_shipped_config_groups_pass_the_checks(group):
    compose([group])


def test_data_fields_take_new_keys_as_documented():
    cfg, _ = compose(["data.fields.text=body", "data.fields.id=key"])
    assert cfg.data.fields == {"text": "body", "id": "key"}
    cfg, _ = compose(["data=broad", "data.fields.instruction=question"])
    assert cfg.data.fields == {"instruction": "question"}
    with pytest.raises(UserError, match="unknown config key data.fieldz"):
        compose(["data.fieldz.text=body"])


def test_data_fields_text_body_reads_the_column_as_documented(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", [{"body": "def f(x):\n    return x"}])
    cfg, _ = compose([f"data.path={path}", "data.format=text", "data.fields.text=body"])
    ds, _ = prepare_dataset(cfg.data, tokenizer)
    assert tokenizer.decode(ds[0]["input_ids"]) == "def f(x):\n    return x"


def test_python_api_gets_the_same_checks():
    with pytest.raises(UserError, match=r"decode.top_p=1.5"):
        DecodeConfig(top_p=1.5)
    with pytest.raises(UserError, match=r"data.distill.shard_rows=0"):
        DistillConfig(shard_rows=0)
    with pytest.raises(UserError, match=r"data.heldout_fraction=1.5"):
        DataConfig(heldout_fraction=1.5)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["distill", "data.distill.batch_size=0", "data.distill.out_dir=d"], "data.distill.batch_size=0"),
        (["distill", "data.distill.shard_rows=0", "data.distill.out_dir=d"], "data.distill.shard_rows=0"),
        (
            ["distill", "data.distill.max_new_tokens=0", "data.distill.out_dir=d"],
            "data.distill.max_new_tokens=0",
        ),
        (
            ["features", "data.features.batch_tokens=0", "data.features.out_dir=f"],
            "data.features.batch_tokens=0",
        ),
        (["data", "data.heldout_fraction=1.5"], "data.heldout_fraction=1.5"),
        (["data-speed", "speed.topk=-1"], "speed.topk=-1"),
        (["tree", "heads=h", "decode.tree_prompts=0"], "decode.tree_prompts=0"),
        (["tree", "heads=h", "decode.tree_new_tokens=0"], "decode.tree_new_tokens=0"),
        (["eval", "heads=h", "eval.prompts=spec-bench"], "eval.prompts=spec-bench"),
        (["eval", "heads=h", "eval.baselines=[pdl]"], "eval.baselines=pdl"),
        (["generate", "heads=h", "prompt=hi", "decode.top_p=1.5"], "decode.top_p=1.5"),
        (["speed", "heads=h", "speed.batch_sizes=[0]"], "speed.batch_sizes=[0]"),
        (["train-speed", "speed.steps=0"], "speed.steps=0"),
        (["data-speed", "speed.dtype=int8"], "speed.dtype=int8"),
        (["bench", "bench.distill_batch_size=0"], "bench.distill_batch_size=0"),
        (
            ["distill", "data.distill.backend=cuda-graphs", "data.distill.out_dir=d"],
            "data.distill.backend=cuda-graphs",
        ),
    ],
)
def test_commands_stop_before_writing_anything(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text("{}")
    before = snapshot(tmp_path)
    assert main([*args, "target=tiny-llama"]) == 1
    assert needle in one_line_error(capsys)
    assert snapshot(tmp_path) == before


# Values of the benchmark commands' own keys (and the keys they share), each refused when the
# command line is read, in one line naming the key as typed: (argv, what the line says).
CHECKED_WHEN_READ = [
    (["speed", "heads=h", "speed.batch_sizes=[0]"], "speed.batch_sizes=[0]"),
    (["speed", "heads=h", "speed.batch_sizes=[-1]"], "speed.batch_sizes=[-1]"),
    (["speed", "heads=h", "speed.batch_sizes=[]"], "speed.batch_sizes=[]"),
    (["speed", "heads=h", "speed.batch_sizes=4"], "speed.batch_sizes=4 is not a list"),
    (["speed", "heads=h", "speed.prompts=0"], "speed.prompts=0"),
    (["speed", "heads=h", "speed.prompts=-3"], "speed.prompts=-3"),
    (["speed", "heads=h", "speed.prompts=4"], "a batch of 8, more than the 4 prompts"),
    (["speed", "heads=h", "speed.dynamic=[[0,4,8]]"], "speed.dynamic entry [0, 4, 8]"),
    (["speed", "heads=h", "speed.curve=maybe"], "speed.curve=maybe is not a boolean"),
    (["train-speed", "speed.steps=0"], "speed.steps=0"),
    (["train-speed", "speed.tokens=-1"], "speed.tokens=-1"),
    (["train-speed", "speed.cache="], "speed.cache is empty"),
    (["data-speed", "speed.dtype=int8"], "speed.dtype=int8"),
    (["data-speed", "speed.distill_prompts=-3"], "speed.distill_prompts=-3"),
    (["data-speed", "speed.batch_tokens=0"], "speed.batch_tokens=0"),
    (["data-speed", "speed.batch_tokens=-8"], "speed.batch_tokens=-8"),
    (["data-speed", "speed.feature_tokens=-5"], "speed.feature_tokens=-5"),
    (["data-speed", "speed.distill_batch_size=0"], "speed.distill_batch_size=0"),
    (["data-speed", "data.distill.backend=cuda-graphs"], "data.distill.backend=cuda-graphs"),
    (["distill", "data.distill.backend=cuda-graphs"], "data.distill.backend=cuda-graphs"),
    (["distill", "data.distill.backend=onednn", "target.dtype=bfloat16"], "data.distill.backend=onednn"),
    (["bench", "bench.drafters=[]"], "bench.drafters=[] trains nothing"),
    (["bench", "bench.drafters=[eagle2]"], "bench.drafters=['eagle2'] names unknown"),
    (["bench", "bench.drafters=[medusa,medusa]"], "names one twice"),
    (["bench", "bench.topk=-1"], "bench.topk=-1"),
    (["bench", "bench.distill_prompts=-3"], "bench.distill_prompts=-3"),
    (["bench", "bench.distill_prompts=0", "bench.teacher_tokens=0"], "leave nothing to train on"),
    (["bench", "bench.eval_prompts=0"], "bench.eval_prompts=0"),
    (["bench", "bench.shard_mb=0"], "bench.shard_mb=0"),
    (["bench", "bench.distill_batch_size=0"], "bench.distill_batch_size=0"),
    (["bench", "bench.out_dir="], "bench.out_dir is empty"),
    (["bench", "bench.eval_sets=[gsm8k-test]"], "bench.eval_sets has 'gsm8k-test'"),
    (["bench", "bench.baselines=[assisted]"], "bench.baselines has ['assisted']"),
    (["bench", "data.distill.backend=cuda-graphs"], "data.distill.backend=cuda-graphs"),
    (["demo", "bench.eval_prompts=3"], "demo runs fixed sizes into outputs/demo and reads no bench.* key"),
    (["eval", "heads=h", "eval.baselines=pld"], "eval.baselines=pld is not a list"),
    (["train", "train.out_dir="], "train.out_dir is empty"),
]


def suggested_runs(argv: list[str], line: str) -> list[list[str]]:
    """Each fix ``line`` suggests, as the command line that applies it to ``argv``: a whole command
    in backquotes, else every ``key=value`` after the first "; " (replacing the typed value of that
    key), or the first value of "use one of A, B" for the key the line begins with."""
    quoted = re.search(r"`draftheads ([\w-]+) ([^`]*)`", line)
    if quoted:
        return [[quoted.group(1), *quoted.group(2).split()]]
    fix = line.partition("; ")[2]
    tokens = [t.strip("'\"(),").split("|")[0] for t in re.findall(r"[\w.-]+=\S+", fix)]
    first = re.search(r"use one of ([\w-]+)", fix)
    if first:
        tokens.append(f"{line.split('=')[0]}={first.group(1)}")
    runs = []
    for token in tokens:
        key = token.split("=")[0]
        runs.append([argv[0], *(a for a in argv[1:] if a.split("=")[0] != key), token])
    return runs


@pytest.mark.parametrize("argv,needle", CHECKED_WHEN_READ, ids=[" ".join(a) for a, _ in CHECKED_WHEN_READ])
def test_bench_and_speed_values_are_refused_when_read_and_every_suggested_fix_is_accepted(
    argv, needle, capsys
):
    assert main([*argv, "--cfg", "job"]) == 1
    line = one_line_error(capsys).removeprefix("error: ")
    assert needle in line, line
    runs = suggested_runs(argv, line)
    assert runs, f"no fix suggested: {line}"
    for run in runs:
        assert main([*run, "--cfg", "job"]) == 0, (run, capsys.readouterr().err)
        capsys.readouterr()


def test_demo_help_says_it_reads_no_bench_keys(capsys):
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "no bench.* keys" in out and "bench.eval_prompts" not in out


def test_a_prompt_file_with_other_column_names_is_read_with_eval_keys(tmp_path, capsys):
    from draftheads.conf.cli import parse
    from draftheads.conf.commands.decode import read_prompts

    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "What is 2+2?"}, {"question": "Name a colour."}])
    argv = [
        "eval",
        "heads=none",
        "target=tiny-llama",
        f"eval.prompts={path}",
        f"eval.out_dir={tmp_path / 'e'}",
    ]
    assert main(argv) == 1
    line = one_line_error(capsys).removeprefix("error: ")
    assert "eval.format" in line and "eval.fields" in line and "data." not in line, line
    for run in suggested_runs(argv, line):
        assert main([*run, "--cfg", "job"]) == 0, (run, capsys.readouterr().err)
    assert not (tmp_path / "e").exists()
    args = parse([*argv, "eval.fields.prompt=question"]).args
    assert [p.turns for p in read_prompts(args.eval)] == [["What is 2+2?"], ["Name a colour."]]


TINY_BENCH = [
    "target=tiny-llama",
    "bench.distill_prompts=2",
    "bench.distill_new_tokens=2",
    "bench.teacher_tokens=0",
    "bench.drafters=[medusa]",
    "bench.medusa_steps=1",
    "bench.eval_sets=[heldout]",
    "bench.eval_prompts=1",
    "bench.eval_new_tokens=2",
    "bench.baselines=[]",
    "bench.shared_data=",
]


@pytest.mark.parametrize(
    "override,needle",
    [
        ("bench.out_dir=a-file", "bench.out_dir=a-file is an existing file"),
        ("bench.out_dir=/proc/x", "bench.out_dir=/proc/x cannot be written"),
        ("bench.out_dir=project", "bench.out_dir=project holds other files (README.md)"),
        ("bench.docs=/proc/x/bench.md", "bench.docs=/proc/x cannot be written"),
        ("bench.docs=project", "bench.docs=project is a directory"),
        ("bench.docs=notes.md", "notes.json beside it was not written by draftheads bench"),
    ],
)
def test_bench_output_paths_are_checked_before_the_first_stage(
    tmp_path, monkeypatch, capsys, override, needle
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("keep me")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "README.md").write_text("# mine")
    (tmp_path / "notes.json").write_text('{"mine": true}')
    before = snapshot(tmp_path)
    defaults = [d for d in ("bench.out_dir=b", "bench.docs=") if d.split("=")[0] != override.split("=")[0]]
    assert main(["bench", *TINY_BENCH, *defaults, override]) == 1
    assert needle in one_line_error(capsys)
    assert snapshot(tmp_path) == before


def hub_lookups(monkeypatch) -> list:
    """The calls ``datasets.load_dataset`` receives from now on (it is what looks a name up on the Hub)."""
    import datasets

    calls: list = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_typo_in_a_prompt_set_name_lists_the_sets_without_a_hub_lookup(monkeypatch):
    calls = hub_lookups(monkeypatch)
    with pytest.raises(UserError) as e:
        load_prompts("gsm8k-test")
    msg = str(e.value)
    assert "\n" not in msg and "gsm8k-test" in msg and ", ".join(PROMPT_SETS) in msg
    assert set(SHARED) | {"heldout", "humaneval", "long", "copy"} == set(PROMPT_SETS) and calls == []


def test_prompt_file_without_usable_rows_names_the_file_and_the_reasons(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ["not json", {"prompt": ""}, {"prompt": 3}])
    with pytest.raises(UserError) as e:
        load_prompts(path)
    msg = str(e.value)
    assert "\n" not in msg and "p.jsonl" in msg
    assert "1x invalid JSON" in msg and "empty turns[0]" in msg and "turns[0] is int" in msg


def test_corpus_without_prompts_names_the_file_and_the_reasons(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": "plain"}, "{broken"])
    with pytest.raises(UserError) as e:
        prompts_from_config(DataConfig(path=path))
    msg = str(e.value)
    assert "\n" not in msg and "c.jsonl: 2 read" in msg and "no user turn" in msg and "invalid JSON" in msg


@pytest.mark.parametrize("content", ["", "\n\n", "[]"])
def test_an_empty_data_file_is_named(tmp_path, tokenizer, content):
    path = tmp_path / ("e.jsonl" if content != "[]" else "e.json")
    path.write_text(content)
    with pytest.raises(UserError, match=rf"data.path={path} is empty"):
        prepare_dataset(DataConfig(path=str(path)), tokenizer)


def test_a_mapped_column_that_is_absent_is_named_in_the_reasons(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", [{"body": "some text"}])
    with pytest.raises(UserError) as e:
        prepare_dataset(DataConfig(path=path, format="text", fields={"text": "bdy"}), tokenizer)
    assert "missing text (column 'bdy')" in str(e.value) and "\n" not in str(e.value)


def test_a_typo_in_data_path_is_refused_without_a_hub_lookup(tmp_path, tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = hub_lookups(monkeypatch)
    with pytest.raises(
        UserError, match=r"data.path=embeded is not a file .*did you mean data.path=embedded\?"
    ):
        prepare_dataset(DataConfig(path="embeded"), tokenizer)
    with pytest.raises(UserError, match=r"data.path=trian.jsonl does not exist"):
        prepare_dataset(DataConfig(path="trian.jsonl"), tokenizer)
    assert calls == []


def test_a_missing_mixture_component_is_named_by_its_component(tmp_path, tokenizer, monkeypatch):
    """A required component's bad path names the component it belongs to, not data.path; the
    broad preset's GSM8K and CodeAlpaca are optional: absent from data.data_dir, left out, said."""
    monkeypatch.chdir(tmp_path)
    mixture = [{"name": "mine", "path": "./mine.jsonl"}, {"name": "stdlib", "path": "embedded:stdlib"}]
    with pytest.raises(UserError, match=r"^data.mixture\[mine\].path=./mine.jsonl does not exist"):
        prepare_dataset(DataConfig(mixture=mixture), tokenizer)
    cfg, _ = compose(["data=broad", f"data.data_dir={tmp_path / 'none'}", "data.max_rows=20"])
    _, report = prepare_dataset(cfg.data, tokenizer, "train")
    assert [m.split()[0] for m in report.missing] == ["gsm8k", "codealpaca"]
    assert {s.name for s in report.sources} == {"humaneval", "pydoc", "stdlib"}


def documented_command_lines(doc: Path) -> list[list[str]]:
    """``draftheads <command> key=value ...`` lines of a doc's code blocks and inline code, as argv."""
    import shlex

    text = re.sub(r"\\\n\s*", " ", doc.read_text())  # a command continued with a backslash is one line
    lines = re.findall(r"^draftheads (\w+ [^#\n]*)", text, flags=re.M)
    lines += re.findall(r"`draftheads (\w+ [^`]*)`", text)
    return [
        shlex.split(line.replace("...", "").replace("=DIR", "=outputs/x").replace("OUT_DIR", "outputs/x"))
        for line in lines
    ]


def test_every_command_line_of_the_data_docs_is_accepted(monkeypatch, capsys):
    doc = Path(__file__).resolve().parents[1] / "docs" / "data.md"
    argvs = documented_command_lines(doc)
    assert len(argvs) >= 6
    for argv in argvs:
        assert main([*argv, "--cfg", "job"]) == 0, (argv, capsys.readouterr().err)
    for override in [
        "data.fields.text=body",
        "data.fields={conversations: dialog, from: speaker, value: text}",
    ]:
        assert main(["data", override, "--cfg", "job"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("field,value", [("temperature", float("inf")), ("typical_epsilon", float("nan"))])
def test_a_decode_config_built_in_python_refuses_a_non_finite_value(field, value):
    from draftheads.conf.schema.decode import DecodeConfig

    with pytest.raises(UserError, match=f"decode.{field}={value} is not a finite number"):
        DecodeConfig(**{field: value})
