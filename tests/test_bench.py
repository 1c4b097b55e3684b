"""The end-to-end pipeline behind `make bench` and `make demo`, at toy size on a tiny target."""

from __future__ import annotations

from dataclasses import replace

import pytest

from draftheads.conf.cli import compose
from draftheads.decode.bench import BEGIN, END, pipeline, replace_section, summary_lines, write_docs


@pytest.mark.slow
def test_pipeline_runs_every_stage_and_a_rerun_skips_them(tmp_path, tiny_llama, monkeypatch, capsys):
    cfg, _ = compose(["target=tiny-llama"])
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
        scaling_tokens=[28, 56],
        scaling_steps_per_10k_tokens=1,
        eval_sets=["heldout", "spec_bench"],
        eval_prompts=2,
        eval_new_tokens=8,
        docs="",
    )
    results = pipeline(cfg, b)
    out = tmp_path / "bench"
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
    *subsets, main = results["scaling"]
    assert len(subsets) == 2 and all(p["answer_tokens"] <= n for p, n in zip(subsets, [28, 56]))
    assert main["tau"] == results["drafters"]["eagle3"]["heldout"]["tau"]
    assert main["answer_tokens"] == results["train"]["eagle3"]["answer_tokens"] > subsets[-1]["answer_tokens"]

    # the training-throughput benchmark runs the bench recipe on the bench's feature cache
    from draftheads.train import speed

    capsys.readouterr()
    speed.main(
        ["--cache", str(out / "features"), "--draft", "eagle3", "--target", "tiny-llama", "--steps", "2"]
    )
    printed = capsys.readouterr().out
    assert (
        len(printed.splitlines()[0].split()) == 3 and "eagle3:" in printed and "training tokens/s" in printed
    )

    # the decoding-speed benchmark on the trained drafter: one table per tree setting, outputs
    # identical to greedy generate at every batch size
    from draftheads.decode import speed as decode_speed

    args = [
        "--heads",
        str(out / "eagle3"),
        "--tiny",
        "llama",
        "--batch",
        "1",
        "2",
        "--new",
        "6",
        "--prompts",
        "2",
    ]
    decode_speed.main([*args, "--dynamic", "2,2,3", "3,3,5"])
    printed = capsys.readouterr().out
    assert "top_k_draft=2 depth=2 total_tokens=3" in printed and "top_k_draft=3 depth=3" in printed
    rows = [line for line in printed.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 4 and all(line.endswith("| True |") for line in rows)

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


def test_speed_dynamic_setting_parses_and_names_a_malformed_value():
    from draftheads.decode.speed import dynamic_setting

    assert dynamic_setting("4,5,12") == {"top_k_draft": 4, "depth": 5, "total_tokens": 12}
    with pytest.raises(SystemExit, match=r"--dynamic '4,5': give top_k_draft,depth,total_tokens, e.g. 4,4,8"):
        dynamic_setting("4,5")
