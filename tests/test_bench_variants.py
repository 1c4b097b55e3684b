"""``bench.variants``: recipe rows trained on the main drafters' own data and passes, each
measured drafter only, cached like every stage; and the rows it refuses before any stage."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from draftheads.bench.ablation_rows import ALONE
from draftheads.bench.pipeline import pipeline
from draftheads.bench.report import write_docs
from draftheads.conf.cli import parse
from draftheads.conf.errors import UserError
from tests.test_bench import tiny_mixture_bench


def test_variants_train_on_the_main_data_and_passes_and_a_rerun_reuses_them(
    tmp_path, tiny_llama, monkeypatch
):
    """With distilled answers beside the teacher-forced text, a variant reads the main drafters'
    mixture for the same passes (``bench.epochs`` multiplies them), trains its own overrides, and
    is decoded with its own tree alone; a rerun trains and decodes nothing."""
    cfg, b = tiny_mixture_bench(
        tmp_path,
        drafters=["dflash"],
        variants=["dflash 2 layers", "eagle3 2 passes", "dflash 2 layers drafter only"],
        drafter_only=True,
    )
    out = tmp_path / "bench"
    results = pipeline(cfg, b)
    main = results["train"]["dflash"]
    deep, passes = results["variants"]["dflash 2 layers"], results["variants"]["eagle3 2 passes"]
    assert deep["overrides"] == ["draft=dflash", "draft.num_decoder_layers=2"] and passes["overrides"] == []
    for row in (deep, passes):
        assert (
            row["answer_tokens"] == main["answer_tokens"]
            and row["distilled_tokens"] == main["distilled_tokens"] > 0
        )
        assert row["data"] == "teacher + distilled" and 1.0 <= row["tau"] <= 1 + 6 and row["prompts"] == 1
    # a row named "... drafter only" is its training twin, measured the same way
    assert results["variants"]["dflash 2 layers drafter only"] == deep
    assert deep["epochs"] == pytest.approx(main["epochs"]) and passes["epochs"] == pytest.approx(
        2 * main["epochs"]
    )
    config = json.loads((out / "variants" / "dflash-2-layers" / "config.json").read_text())
    assert config["kind"] == "dflash" and config["spec"]["num_decoder_layers"] == 2
    eagle = json.loads((out / "variants" / "eagle3-2-passes" / "config.json").read_text())
    assert eagle["kind"] == "eagle" and eagle["spec"]["version"] == 3
    for folder in ("dflash-2-layers", "eagle3-2-passes"):
        marker = json.loads((out / "variants" / folder / "drafter-only" / ".done").read_text())
        assert marker["settings"]["decode"] == ALONE
    # the variants' minutes are their own, not a stage of the main run
    assert not any("variant" in stage for stage in results["stage_minutes"])

    def nothing(*a, **k):
        raise AssertionError("a finished variant ran again")

    monkeypatch.setattr("draftheads.train.recipe.train", nothing)
    monkeypatch.setattr("draftheads.bench.study.heldout_tau", nothing)
    again = pipeline(cfg, b)
    assert again["variants"] == results["variants"]

    docs = tmp_path / "docs" / "benchmarks.md"
    write_docs(again, b, docs)
    assert (
        json.loads(docs.with_suffix(".json").read_text())["variants"]["dflash 2 layers"]["tau"] == deep["tau"]
    )
    text = docs.read_text()
    assert (
        "### Recipe rows at full data" in text
        and "| dflash 2 layers | `draft=dflash draft.num_decoder_layers=2` |" in text
    )


@pytest.mark.parametrize(
    "settings,needle",
    [
        ({"variants": ["dflash 7 layers"]}, "bench.variants: unknown rows ['dflash 7 layers']"),
        (
            {"variants": ["medusa 3 heads"]},
            "bench.variants row 'medusa 3 heads' does not train on the main data",
        ),
        ({"variants": ["dflash chain"]}, "bench.variants row 'dflash chain' does not train on the main data"),
        ({"variants": ["dflash regenerated"]}, "row 'dflash regenerated' does not train on the main data"),
        ({"variants": ["dflash 2 layers"], "teacher_tokens": 0}, "set bench.teacher_tokens"),
    ],
)
def test_a_variant_that_cannot_train_on_the_main_data_is_refused_before_any_stage(tmp_path, settings, needle):
    cfg = parse(["bench", "target=tiny-llama"]).args
    b = replace(cfg.bench, **{"out_dir": str(tmp_path / "bench"), "teacher_tokens": 1000, **settings})
    with pytest.raises(UserError) as e:
        pipeline(cfg, b)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "bench").exists()
