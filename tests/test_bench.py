"""The end-to-end pipeline behind `make bench` and `make demo`, at toy size on a tiny target."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from bench.lab.study import run as study  # the pipeline with the maintainers' study rows
from draftheads.bench.figures import figures
from draftheads.bench.pipeline import pipeline
from draftheads.bench.report import BEGIN, END, summary_lines, write_docs
from draftheads.bench.stages import load_rows
from draftheads.conf.cli import main, parse
from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DraftConfig
from tests.conftest import get_target


def tiny_bench(tmp_path, *overrides: str, **settings):
    """``(args, bench config)`` for the tiny target: outputs under ``tmp_path/bench``, no shared
    data folder, no docs page, held-out prompts only, no extra baselines and no drafter-only
    rows unless ``settings`` say otherwise."""
    cfg = parse(["bench", "target=tiny-llama", *overrides]).args
    base = dict(
        out_dir=str(tmp_path / "bench"),
        shared_data=str(tmp_path / "no-shared-data"),
        eval_sets=["heldout"],
        baselines=[],
        drafter_only=False,
        workloads=False,
        docs="",
    )
    return cfg, replace(cfg.bench, **{**base, **settings})


def tiny_mixture_bench(tmp_path, **settings):
    """:func:`tiny_bench` with teacher-forced text (600 answer tokens) and 4 distilled answers
    beside it, one held-out prompt of 6 new tokens."""
    base = dict(
        distill_prompts=4,
        distill_new_tokens=6,
        distill_batch_size=4,
        teacher_tokens=600,
        scaling_compute=1200,
        topk=8,
        shard_mb=0.1,
        eval_prompts=1,
        eval_new_tokens=6,
    )
    return tiny_bench(tmp_path, "data.max_rows=12", **{**base, **settings})


def test_pipeline_runs_every_stage_and_a_rerun_skips_them(tmp_path, tiny_llama, monkeypatch, capsys):
    cfg, b = tiny_bench(
        tmp_path,
        "decode.tree_prompts=4",  # the Medusa tree from 4 prompts' heads, 16 tokens each
        "decode.tree_new_tokens=16",
        "decode.max_new_tokens=4",  # the workload rows' answers
        drafters=["medusa", "eagle3", "dflash"],
        distill_prompts=8,
        self_prompts=0,
        distill_new_tokens=34,  # above the 32 anchors per row the bench draws for DFlash
        distill_batch_size=4,
        teacher_tokens=0,
        medusa_steps=4,
        eagle_steps=4,
        scaling_tokens=[],
        scaling_steps_per_10k_tokens=1,
        eval_sets=["heldout", "spec_bench"],
        eval_prompts=2,
        eval_new_tokens=8,
        baselines=["pld"],
        drafter_only=True,
        workloads=True,
    )
    first = pipeline(cfg, b)
    out = tmp_path / "bench"
    # the EAGLE drafter beyond batch 1 and on its first call: every batch size against batched
    # greedy, greedy identical; cold and warm first calls; printed and kept for benchmarks.json
    work = first["workloads"]
    assert [r["batch"] for r in work["batches"]] == [1, 4, 8] and all(r["identical"] for r in work["batches"])
    assert work["settings"]["heads"] == str(out / "eagle3")
    pairs = work["first_call"]["pairs"]
    assert len(pairs) == 2 and all(p["cold"] > 0 and p["warm"] > 0 for p in pairs)
    # the long prompts sampled at 0.7 and 1.0, against the faster plain sampling loop
    sampled = work["sampling"]["long"]
    assert [r["temperature"] for r in sampled] == [0.7, 1.0] and all(r["tau"] >= 1.0 for r in sampled)
    assert all(
        r["baseline_tokens_per_s"] == max(r["generate_tokens_per_s"], r["retiring_tokens_per_s"])
        for r in sampled
    )
    lines = summary_lines(first)
    assert "workloads batch 8:" in lines and lines.count("first call: cold") == 2
    assert "workloads sampling long T=1.0: τ" in lines
    kept = figures(first)
    assert kept["first_call"] == work["first_call"] and "first_call" not in kept["workloads"]
    # scaling points (the study's, from the checkout) at exactly 2 and 4 cached rows' answer tokens
    # (in the stage's row order), so both are reachable whatever the distilled answers' lengths;
    # every other stage is cached now
    rows = load_rows(out / "features", 64, "all")
    sums = [sum(int(r["loss_mask"].sum()) for r in rows[:k]) for k in (2, 4)]
    b = replace(b, scaling_tokens=sums)
    monkeypatch.setattr("bench.lab.scaling.MIN_STEPS", 4)  # the main drafters' 4 steps, not 50
    results = study(cfg, b)
    for stage in (
        "distill/prompts",
        "features",
        "medusa",
        "eagle3",
        "medusa/eval-heldout",
        "eagle3/eval-heldout",
        "dflash/eval-heldout",
    ):
        assert (out / stage / ".done").is_file(), stage
    assert (out / "medusa" / "tree.json").is_file()
    # every stage of the main run recorded its time; both drafters share each evaluation's time
    stages = results["stage_minutes"]
    assert list(stages) == [
        "distill",
        "features",
        "train medusa",
        "medusa tree",
        "train eagle3",
        "train dflash",
        "eval heldout",
        "held-out τ, drafter only",
    ] and all(m > 0 for m in stages.values())
    # every drafter was decoded in one loop per prompt set (the greedy runs shared)
    for kind in ("medusa", "eagle3", "dflash"):
        marker = json.loads((out / kind / "eval-heldout" / ".done").read_text())
        assert marker["decoded_with"] == ["medusa", "eagle3", "dflash"] and marker["seconds"] > 0
    # and each drafter's held-out τ once more with its own tree alone: no lookup branch, no planner
    assert list(results["drafter_only"]) == ["medusa", "eagle3", "dflash"]
    for kind in ("medusa", "eagle3", "dflash"):
        alone = results["drafter_only"][kind]
        assert alone["prompts"] == 2 and 1.0 <= alone["tau"] <= 1 + 8
        marker = json.loads((out / kind / "drafter-only" / ".done").read_text())
        assert marker["settings"]["decode"] == {"lookup": False, "cost_aware": False}
    # Spec-Bench is absent here: skipped, not failed; held-out was decoded exactly
    assert set(results["drafters"]["medusa"]) == {"heldout"}
    for kind in ("medusa", "eagle3", "dflash"):
        assert results["drafters"][kind]["heldout"]["greedy_identical"] == 1.0
    assert (
        "pld" in results["drafters"]["medusa"]["heldout"]
        and "pld" not in results["drafters"]["eagle3"]["heldout"]
    )
    # the cached-subset points, then the main drafter (every cached token, same held-out prompts)
    *subsets, full = results["scaling"]
    assert [p["answer_tokens"] for p in subsets] == sums
    assert full["tau"] == results["drafters"]["eagle3"]["heldout"]["tau"]
    assert full["answer_tokens"] == results["train"]["eagle3"]["answer_tokens"] > subsets[-1]["answer_tokens"]

    # the training-throughput benchmark runs the bench recipe on the bench's feature cache
    capsys.readouterr()
    cache = f"speed.cache={out / 'features'}"
    assert main(["train-speed", cache, "draft=eagle3", "target=tiny-llama", "speed.steps=2"]) == 0
    printed = capsys.readouterr().out
    assert (
        len(printed.splitlines()[0].split()) == 3 and "eagle3:" in printed and "training tokens/s" in printed
    )
    # padded micro-batches (speed.pack=false) train to the same losses as the packed default
    assert (
        main(["train-speed", cache, "draft=eagle3", "target=tiny-llama", "speed.steps=2", "speed.pack=false"])
        == 0
    )
    padded = capsys.readouterr().out
    packed_losses, padded_losses = (
        [float(x) for x in p.splitlines()[0].split()[1:]] for p in (printed, padded)
    )
    assert padded_losses == pytest.approx(packed_losses, abs=2e-3)
    # DFlash reads three of the cache's four layers, and states its FLOPs per row token
    assert main(["train-speed", cache, "draft=dflash", "target=tiny-llama", "speed.steps=2"]) == 0
    printed = capsys.readouterr().out
    assert (
        "dflash:" in printed
        and "training tokens/s" in printed
        and "GFLOP of matmuls per row token" in printed
    )

    # the decoding-speed benchmark on the trained drafter: one table per tree setting, outputs
    # identical to greedy generate at every batch size
    args = [f"heads={out / 'eagle3'}", "target=tiny-llama", "speed.batch_sizes=[1,2]", "speed.prompts=2"]
    argv = ["speed", *args, "decode.max_new_tokens=6", "speed.dynamic=[[2,2,3],[3,3,5]]", "speed.curve=true"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "top_k_draft=2 depth=2 total_tokens=3" in printed and "top_k_draft=3 depth=3" in printed
    assert "verify-cost curve" in printed and "| eager | " in printed
    rows = [line for line in printed.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    # identical to greedy on the same backend (the second-to-last column) at every batch size
    assert len(rows) == 4 and all(line.split("|")[-3].strip() == "True" for line in rows)

    # a rerun finds every stage done and trains nothing
    def no_training(*a, **k):
        raise AssertionError("a cached stage ran again")

    monkeypatch.setattr("draftheads.train.recipe.train", no_training)
    again = study(cfg, b)
    assert again["drafters"]["medusa"]["heldout"]["tau"] == results["drafters"]["medusa"]["heldout"]["tau"]
    # a lost report is decoded again for its drafter alone
    shutil.rmtree(out / "eagle3" / "eval-heldout")
    again = study(cfg, b)
    decoded_with = {
        k: json.loads((out / k / "eval-heldout" / ".done").read_text())["decoded_with"]
        for k in ("medusa", "eagle3", "dflash")
    }
    assert decoded_with == {
        "medusa": ["medusa", "eagle3", "dflash"],
        "eagle3": ["eagle3"],
        "dflash": ["medusa", "eagle3", "dflash"],
    }
    assert again["drafters"]["eagle3"]["heldout"]["greedy_identical"] == 1.0

    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nHand-written analysis stays.\n")
    write_docs(results, b, docs)
    write_docs(results, b, docs)
    text = docs.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "Hand-written analysis stays." in text
    assert "| medusa | heldout |" in text and "τ" in summary_lines(results)
    alone = results["drafter_only"]["eagle3"]["tau"]
    assert (
        "own tree alone" in text
        and f"eagle3 {alone:.2f}" in text
        and "drafter only" in summary_lines(results)
    )
    assert "| **all stages** |" in text and f"| **{sum(stages.values()):.1f}** |" in text

    # EAGLE-2's published tree: one more row per prompt set, every one of its nodes verified and
    # the output still the target's greedy one; the default rows are read from their cache
    wide = study(cfg, replace(b, published_tree=True))
    row = wide["drafters"]["eagle3 (published 60-node tree)"]["heldout"]
    default = wide["drafters"]["eagle3"]["heldout"]
    assert row["greedy_identical"] == 1.0 and default == again["drafters"]["eagle3"]["heldout"]
    # unpruned: wider than the default's 8 nodes and 6-token chain, though short of 60 on average,
    # since a step verifies no node past the tokens left
    assert row["tree_tokens_per_step"] > 2 * (8 + 6) >= 2 * default["tree_tokens_per_step"]
    marker = json.loads((out / "eagle3" / "eval-heldout-tree" / ".done").read_text())
    assert marker["settings"]["tree"] == {
        "dynamic": True,
        "top_k_draft": 10,
        "depth": 6,
        "total_tokens": 60,
        "cost_aware": False,
    }
    assert wide["stage_minutes"] == again["stage_minutes"]  # an opt-in row: not a stage of the default run
    write_docs(wide, b, docs)
    assert "| eagle3 (published 60-node tree) | heldout |" in docs.read_text()


def test_speed_dynamic_setting_names_a_malformed_value(capsys):
    assert main(["speed", "heads=x", "speed.dynamic=[[4,4]]"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: speed.dynamic entry [4, 4]") and "[top_k_draft,depth,total_tokens]" in err


@pytest.mark.slow
def test_teacher_forced_bench_scales_ablates_resumes_and_writes_json(tmp_path, tiny_llama, monkeypatch):
    """Teacher-forced cache, main EAGLE-3 from disk, two scaling points at equal compute, one
    ablation row; deleting a later stage and rerunning recomputes only that stage."""
    cfg, b = tiny_bench(
        tmp_path,
        "data.max_rows=12",
        distill_prompts=0,
        teacher_tokens=1500,
        topk=8,
        shard_mb=0.1,
        drafters=["eagle3"],
        scaling_tokens=[300, 700],
        scaling_compute=1400,
        ablations=["eagle3 init from target", "medusa 3 heads", "dflash chain"],
        ablation_tokens=300,
        ablation_epochs=1.0,
        eval_prompts=2,
        eval_new_tokens=8,
    )
    out = tmp_path / "bench"
    results = study(cfg, b)
    teacher = json.loads((out / "teacher" / ".done").read_text())
    assert (
        teacher["answer_tokens"] >= 1500
        and json.loads((out / "teacher" / "manifest.json").read_text())["topk"] == 8
    )
    *subsets, main = results["scaling"]
    assert [p["answer_tokens"] for p in subsets] == sorted(p["answer_tokens"] for p in subsets)
    assert all(abs(p["answer_tokens"] - n) <= 400 for p, n in zip(subsets, b.scaling_tokens))
    # equal compute: answer tokens x epochs is the same for every point, the main drafter included
    for p in [*subsets, main]:
        assert p["answer_tokens"] * p["epochs"] == pytest.approx(1400)
    assert main["answer_tokens"] == teacher["answer_tokens"] and main["tau"] >= 1.0
    row = results["ablations"]["eagle3 init from target"]
    assert row["overrides"] == ["draft.eagle.init_from_target=true"] and row["tau"] >= 1.0
    medusa = results["ablations"]["medusa 3 heads"]  # Medusa rows train on the same cached tokens
    assert medusa["overrides"] == ["draft=medusa", "draft.medusa.num_heads=3"]
    assert medusa["answer_tokens"] == row["answer_tokens"] and medusa["tau"] >= 1.0
    # a decoding-only row decodes the drafter its training twin trains (here trained for it), on
    # the same tokens, reading three of the cache's four layers
    chain = results["ablations"]["dflash chain"]
    one_layer = ["draft=dflash", "draft.dflash.num_decoder_layers=1", "draft.dflash.loss_gamma=0.5"]
    assert chain["overrides"] == one_layer and chain["answer_tokens"] == row["answer_tokens"]
    assert (out / "ablations" / "dflash-1-layer" / "drafter" / "model.safetensors").is_file()
    assert (out / "ablations" / "dflash-chain" / "tau.json").is_file() and chain["tau"] >= 1.0

    # interrupted: a later stage's output is gone; the rerun redoes that stage only

    shutil.rmtree(out / "scaling" / "eagle3-700")
    calls = []
    real = __import__("draftheads.train.recipe", fromlist=["train"]).train
    monkeypatch.setattr(
        "draftheads.train.recipe.train", lambda c, rows=None: calls.append(c) or real(c, rows=rows)
    )

    def no_features(*a, **k):
        raise AssertionError("the feature cache was built again")

    monkeypatch.setattr("draftheads.data.cache.build.build_feature_cache", no_features)
    again = study(cfg, b)
    assert [c.train.output_dir for c in calls] == [str(out / "scaling" / "eagle3-700" / "drafter")]
    assert again["ablations"]["eagle3 init from target"]["tau"] == row["tau"]
    # a finished stage is never reused under other settings: the rerun stops and names it
    with pytest.raises(UserError, match=r"teacher was made with topk=8, not topk=4; delete .*teacher"):
        study(cfg, replace(b, topk=4))
    with pytest.raises(UserError, match=r"bench/eagle3 was made with epochs=0\.\d+, not epochs=1\.\d+;"):
        study(cfg, replace(b, scaling_compute=2000))
    assert (out / "eagle3" / "model.safetensors").is_file()  # nothing was deleted

    docs = tmp_path / "docs" / "benchmarks.md"
    write_docs(again, b, docs)
    record = json.loads(docs.with_suffix(".json").read_text())
    assert record["command"].startswith("draftheads bench")
    assert [p["tau"] for p in record["scaling"]] == [p["tau"] for p in again["scaling"]]
    assert record["ablations"]["eagle3 init from target"]["tau"] == row["tau"]
    assert record["drafters"]["eagle3"]["heldout"]["tau"] == again["drafters"]["eagle3"]["heldout"]["tau"]
    text = docs.read_text()
    assert "## Recipe ablations" in text and "| eagle3 init from target |" in text
    # the data stage and both speedups (stock generate, greedy on the same backend) are reported
    assert again["data"] == teacher and teacher["seconds"] > 0 and "Teacher-forced feature cache" in text
    heldout = record["drafters"]["eagle3"]["heldout"]
    assert heldout["speedup_vs_stock"] == again["drafters"]["eagle3"]["heldout"]["speedup_vs_stock"] > 0
    assert "| turns | τ | vs plain | vs stock |" in text


@pytest.mark.slow
def test_distilled_answers_join_the_teacher_cache_by_view_for_the_main_drafter_only(tmp_path, tiny_llama):
    """With teacher-forced data and distillation, the distilled answers get their own top-k cache;
    the main EAGLE-3 drafter reads teacher rows then distilled rows ``distill_repeats`` times."""
    cfg, b = tiny_mixture_bench(tmp_path, distill_repeats=3, drafters=["eagle3"])
    out = tmp_path / "bench"
    results = pipeline(cfg, b)
    teacher = json.loads((out / "teacher" / "manifest.json").read_text())
    distilled = json.loads((out / "features" / "manifest.json").read_text())
    mix = json.loads((out / "mixture" / "manifest.json").read_text())
    assert distilled["topk"] == teacher["topk"] == 8 and distilled["num_rows"] == 4
    assert mix["num_rows"] == teacher["num_rows"] + 3 * distilled["num_rows"]
    assert mix["num_loss_tokens"] == teacher["num_loss_tokens"] + 3 * distilled["num_loss_tokens"]
    main_run = results["train"]["eagle3"]
    assert main_run["distilled_tokens"] == distilled["num_loss_tokens"] and main_run["distill_repeats"] == 3
    assert main_run["answer_tokens"] == teacher["num_loss_tokens"] + distilled["num_loss_tokens"]
    # the mixed drafter is not a point of the equal-compute curve
    assert results["scaling"] == [] and results["mixture"]["rows"] == 4


@pytest.mark.parametrize(
    "settings,keys",
    [
        ({"ablations": ["eagle3"]}, "bench.ablations"),
        ({"scaling_tokens": [1000], "variants": ["dflash 2 layers"]}, "bench.scaling_tokens, bench.variants"),
    ],
)
def test_the_installed_bench_refuses_the_study_rows_naming_the_checkout_command(tmp_path, settings, keys):
    """The research rows run from a checkout (bench/lab is not installed): the installed pipeline
    refuses them in one line naming the command, before any stage."""
    cfg = parse(["bench", "target=tiny-llama"]).args
    b = replace(cfg.bench, out_dir=str(tmp_path / "bench"), **settings)
    with pytest.raises(UserError) as e:
        pipeline(cfg, b)
    assert str(e.value).startswith(f"{keys}: the research rows are a maintainer's study")
    assert "`python -m bench.lab.study <the same overrides>`" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "bench").exists()


def test_an_unknown_ablation_row_is_refused_before_any_stage(tmp_path):
    cfg = parse(["bench", "target=tiny-llama"]).args
    b = replace(cfg.bench, out_dir=str(tmp_path / "bench"), ablations=["eagle3 ttt 9"])
    with pytest.raises(
        UserError, match=r"bench.ablations: unknown rows \['eagle3 ttt 9'\]; use all or some of"
    ):
        study(cfg, b)
    assert not (tmp_path / "bench").exists()


def test_data_speed_times_both_distillation_loops_and_compares_their_answers(capsys):
    argv = ["data-speed", "target=tiny-llama", "data.max_rows=40", "speed.feature_tokens=0"]
    argv += ["speed.distill_prompts=6", "speed.distill_batch_size=3", "speed.distill_new_tokens=5"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "distill, batched loop" in printed and "distill, transformers generate" in printed
    assert "6 of 6 greedy answers identical between the two loops" in printed


def test_data_speed_times_the_teacher_cache_path_with_eagle3_layers_and_topk(capsys):
    argv = ["data-speed", "target=tiny-llama", "data.max_rows=20", "speed.feature_tokens=400", "speed.topk=4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    layers = DraftConfig.of(kind="eagle", version=3).training_layers(
        get_target("llama")[0].config.num_hidden_layers
    )
    assert f"features (layers {layers} + top-4 logits" in printed


def test_a_setting_added_since_a_stage_ran_and_left_unset_reuses_the_stage(tmp_path):
    """A marker written before a draft field existed lacks it: left null, the field is the
    behaviour the stage ran with; set, the rerun stops naming it."""
    from draftheads.bench.stages import done, mark_done

    mark_done(tmp_path, settings={"epochs": 1.0, "draft": {"kind": "peagle", "peagle": {"num_depths": 8}}})
    unset = {"kind": "peagle", "peagle": {"num_depths": 8, "init_from_eagle3": None}}
    assert done(tmp_path, {"epochs": 1.0, "draft": unset})
    with pytest.raises(
        UserError, match=r"made with draft.peagle.init_from_eagle3=None, not draft.peagle.init_from_eagle3=x;"
    ):
        done(
            tmp_path,
            {
                "epochs": 1.0,
                "draft": {"kind": "peagle", "peagle": {"num_depths": 8, "init_from_eagle3": "x"}},
            },
        )


def test_a_stage_recorded_with_flat_draft_keys_is_reused_and_compared_in_its_kinds_section(tmp_path):
    """The last release recorded a stage's draft settings flat, every kind's keys together: the
    kind's own are read as its section (the others it never read), so an equal drafter reuses the
    stage and a changed key is named in its section."""
    from draftheads.bench.stages import done, mark_done

    mark_done(
        tmp_path, settings={"draft": {"kind": "dflash", "block_size": 16, "num_heads": 4, "ttt_steps": 7}}
    )
    sections = {"medusa": None, "eagle": None, "peagle": None}
    assert done(tmp_path, {"draft": {"kind": "dflash", **sections, "dflash": {"block_size": 16}}})
    with pytest.raises(
        UserError, match=r"made with draft.dflash.block_size=16, not draft.dflash.block_size=8;"
    ):
        done(tmp_path, {"draft": {"kind": "dflash", **sections, "dflash": {"block_size": 8}}})
