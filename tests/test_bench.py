"""The end-to-end pipeline behind `make bench` and `make demo`, at toy size on a tiny target."""

from __future__ import annotations

from dataclasses import replace

import pytest

from draftheads.bench.pipeline import load_rows, pipeline
from draftheads.bench.report import BEGIN, END, replace_section, summary_lines, write_docs
from draftheads.conf.cli import main, parse


@pytest.mark.slow
def test_pipeline_runs_every_stage_and_a_rerun_skips_them(tmp_path, tiny_llama, monkeypatch, capsys):
    cfg = parse(["bench", "target=tiny-llama"]).args
    b = replace(
        cfg.bench,
        out_dir=str(tmp_path / "bench"),
        shared_data=str(tmp_path / "no-shared-data"),
        distill_prompts=8,
        self_prompts=0,
        distill_new_tokens=12,
        distill_batch_size=4,
        medusa_steps=4,
        eagle_steps=4,
        scaling_tokens=[],
        scaling_steps_per_10k_tokens=1,
        eval_sets=["heldout", "spec_bench"],
        eval_prompts=2,
        eval_new_tokens=8,
        docs="",
    )
    pipeline(cfg, b)
    out = tmp_path / "bench"
    # scaling points at exactly 2 and 4 cached rows' answer tokens (in the stage's row order), so
    # both are reachable whatever the distilled answers' lengths; every other stage is cached now
    rows = load_rows(out / "features", 64, "all")
    sums = [sum(int(r["loss_mask"].sum()) for r in rows[:k]) for k in (2, 4)]
    b = replace(b, scaling_tokens=sums)
    results = pipeline(cfg, b)
    for stage in (
        "distill/prompts",
        "features",
        "medusa",
        "eagle3",
        "medusa/eval-heldout",
        "eagle3/eval-heldout",
    ):
        assert (out / stage / ".done").is_file(), stage
    assert (out / "medusa" / "tree.json").is_file()
    # Spec-Bench is absent here: skipped, not failed; held-out was decoded exactly
    assert set(results["drafters"]["medusa"]) == {"heldout"}
    for kind in ("medusa", "eagle3"):
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
    again = pipeline(cfg, b)
    assert again["drafters"]["medusa"]["heldout"]["tau"] == results["drafters"]["medusa"]["heldout"]["tau"]

    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nHand-written analysis stays.\n")
    write_docs(results, b, docs)
    write_docs(results, b, docs)
    text = docs.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "Hand-written analysis stays." in text
    assert "| medusa | heldout |" in text and "τ" in summary_lines(results)


def test_replace_section_keeps_the_rest(tmp_path):
    p = tmp_path / "x.md"
    replace_section(p, "one")
    p.write_text("intro\n" + p.read_text() + "outro\n")
    replace_section(p, "two")
    assert p.read_text() == f"intro\n{BEGIN}\ntwo\n{END}\noutro\n"


def test_speed_dynamic_setting_names_a_malformed_value(capsys):
    assert main(["speed", "heads=x", "speed.dynamic=[[4,4]]"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: speed.dynamic entry [4, 4]") and "[top_k_draft,depth,total_tokens]" in err
