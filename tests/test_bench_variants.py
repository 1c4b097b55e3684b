"""``bench.variants``: recipe rows trained on the main drafters' own data and passes, each
measured drafter only, cached like every stage; and the rows it refuses before any stage."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.lab.ablation_rows import ABLATIONS, ONE_LAYER
from bench.lab.study import run as pipeline  # the installed pipeline with the study's rows
from draftheads.bench.drafter_only import ALONE
from draftheads.bench.report import write_docs
from draftheads.conf.cli import parse
from draftheads.conf.errors import UserError
from tests.test_bench import tiny_mixture_bench

ONE = [f"{k}={v}" for k, v in ONE_LAYER.items()]  # the one-layer recipe's overrides


def test_variants_train_on_the_main_data_and_passes_and_a_rerun_reuses_them(
    tmp_path, tiny_llama, monkeypatch
):
    """With distilled answers beside the teacher-forced text, a variant reads the main drafters'
    mixture for the same passes (``bench.epochs`` multiplies them), trains its own overrides, and
    is decoded with its own tree alone; a rerun trains and decodes nothing."""
    cfg, b = tiny_mixture_bench(
        tmp_path,
        drafters=["dflash"],
        variants=["dflash 1 layer", "eagle3 2 passes", "dflash 1 layer drafter only"],
        drafter_only=True,
    )
    out = tmp_path / "bench"
    results = pipeline(cfg, b)
    main = results["train"]["dflash"]
    one, passes = results["variants"]["dflash 1 layer"], results["variants"]["eagle3 2 passes"]
    assert one["overrides"] == ["draft=dflash", *ONE] and passes["overrides"] == []
    for row in (one, passes):
        assert (
            row["answer_tokens"] == main["answer_tokens"]
            and row["distilled_tokens"] == main["distilled_tokens"] > 0
        )
        assert row["data"] == "teacher + distilled" and 1.0 <= row["tau"] <= 1 + 6 and row["prompts"] == 1
        # and once more with the decoder's defaults (lookup branch, planner), as the main drafters are
        assert 1.0 <= row["defaults"]["tau"] <= 1 + 6 and row["defaults"]["prompts"] == 1
    # a row named "... drafter only" is its training twin, measured the same way
    assert results["variants"]["dflash 1 layer drafter only"] == one
    assert one["epochs"] == pytest.approx(main["epochs"]) and passes["epochs"] == pytest.approx(
        2 * main["epochs"]
    )
    # the main DFlash has draft=dflash's two layers, the variant the one-layer recipe
    config = json.loads((out / "variants" / "dflash-1-layer" / "config.json").read_text())
    assert config["kind"] == "dflash" and config["spec"]["num_decoder_layers"] == 1
    assert json.loads((out / "dflash" / "config.json").read_text())["spec"]["num_decoder_layers"] == 2
    eagle = json.loads((out / "variants" / "eagle3-2-passes" / "config.json").read_text())
    assert eagle["kind"] == "eagle" and eagle["spec"]["version"] == 3
    for folder in ("dflash-1-layer", "eagle3-2-passes"):
        marker = json.loads((out / "variants" / folder / "drafter-only" / ".done").read_text())
        assert marker["settings"]["decode"] == ALONE
        marker = json.loads((out / "variants" / folder / "defaults-tau" / ".done").read_text())
        assert marker["settings"]["decode"] == {}
    # the variants' minutes are their own, not a stage of the main run
    assert not any("variant" in stage for stage in results["stage_minutes"])

    def nothing(*a, **k):
        raise AssertionError("a finished variant ran again")

    monkeypatch.setattr("draftheads.train.recipe.train", nothing)
    monkeypatch.setattr("draftheads.bench.teacher_stages.heldout_tau", nothing)
    again = pipeline(cfg, b)
    assert again["variants"] == results["variants"]
    # a drafter made under another draft=dflash default (its marker records the resolved draft
    # settings) is refused in one line naming the value, not reported as today's
    marker = out / "dflash" / ".done"
    record = json.loads(marker.read_text())
    record["settings"]["draft"]["dflash"]["num_decoder_layers"] = 1
    marker.write_text(json.dumps(record))
    with pytest.raises(
        UserError,
        match=r"was made with draft.dflash.num_decoder_layers=1, not draft.dflash.num_decoder_layers=2; delete",
    ) as e:
        pipeline(cfg, b)
    assert "\n" not in str(e.value)
    del record["settings"]["draft"]  # a marker from before the draft settings were recorded
    marker.write_text(json.dumps(record))
    with pytest.raises(
        UserError, match=r"made by an earlier draftheads, which did not record its draft; delete"
    ):
        pipeline(cfg, b)

    docs = tmp_path / "docs" / "benchmarks.md"
    write_docs(again, b, docs)
    assert (
        json.loads(docs.with_suffix(".json").read_text())["variants"]["dflash 1 layer"]["tau"] == one["tau"]
    )
    text = docs.read_text()
    assert (
        "### Recipe rows at full data" in text
        and f"| dflash 1 layer | `draft=dflash {' '.join(ONE)}` |" in text
        and f"| {one['tau']:.2f} | {one['defaults']['tau']:.2f} |" in text
    )


def test_every_dflash_row_but_the_defaults_keeps_the_one_layer_recipe_it_was_measured_on():
    """A change of draft=dflash's defaults moves the "dflash" row only: every other DFlash row sets
    the depth and the loss decay, its own values over the one-layer base's."""
    assert ABLATIONS["dflash"] == ["draft=dflash"]
    assert ABLATIONS["dflash 1 layer"] == ["draft=dflash", *ONE]
    assert ABLATIONS["dflash 2 layers"] == [
        "draft=dflash",
        "draft.dflash.loss_gamma=0.5",
        "draft.dflash.num_decoder_layers=2",
    ]
    assert ABLATIONS["dflash 2 layers gamma 1"] == [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=2",
        "draft.dflash.loss_gamma=1",
    ]
    defaults = {"dflash", "dflash drafter only", "dflash full tree"}  # draft=dflash as it is
    rows = {n: r for n, r in ABLATIONS.items() if r[:1] == ["draft=dflash"] and n not in defaults}
    assert len(rows) > 50
    for name, row in rows.items():
        keys = [o.split("=", 1)[0] for o in row]
        assert {*ONE_LAYER} <= {*keys} and len(keys) == len({*keys}), name
    cfg = parse(["train", *ABLATIONS["dflash reference start"]]).args.draft
    assert (cfg.num_decoder_layers, cfg.loss_gamma) == (1, 7.0)
    cfg = parse(["train", "draft=dflash"]).args.draft
    assert (cfg.num_decoder_layers, cfg.loss_gamma) == (2, 1.0)


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


def test_a_row_that_starts_from_another_rows_drafter_trains_after_it_and_reads_its_folder(tmp_path):
    """``@<row>`` names that row's drafter: the row is trained first even when not asked for, and
    the override reads its folder (a "drafter only" row's, the row it decodes)."""
    from bench.lab.rows import resolve_refs, with_refs

    assert with_refs(["peagle 4 depths", "peagle from eagle3 drafter only"]) == [
        "peagle 4 depths",
        "eagle3",
        "peagle from eagle3 drafter only",
    ]
    assert with_refs(["eagle3", "peagle from eagle3"]) == ["eagle3", "peagle from eagle3"]
    resolved = resolve_refs(ABLATIONS["peagle from eagle3"], tmp_path)
    assert resolved == ["draft=peagle", f"draft.peagle.init_from_eagle3={tmp_path / 'eagle3' / 'drafter'}"]
    for name, row in ABLATIONS.items():
        if name.startswith("peagle"):
            trained = [o for o in resolve_refs(row, tmp_path) if not o.startswith("decode.")]
            d = parse(["train", "target=tiny-llama", *trained]).args.draft
            assert d.kind == "peagle", name
