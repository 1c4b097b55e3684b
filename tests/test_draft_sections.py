"""Each kind's keys live in its section, ``draft.<kind>.*``: the flat spelling of the last release
still works with a notice, another kind's section is refused, and configs saved flat read back."""

from __future__ import annotations

import pytest

from draftheads.conf.cli import main, parse
from draftheads.conf.errors import UserError
from draftheads.conf.schema.flat_keys import nested_draft
from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.kinds import DRAFT_KINDS
from draftheads.train.checkpoint import config_mismatch


def test_a_flat_key_is_moved_into_the_chosen_kinds_section_with_one_notice(capsys):
    args = parse(["train", "draft=dflash", "draft.block_size=4", "draft.dflash.loss_gamma=2"]).args
    assert args.draft.dflash.block_size == 4 and args.draft.dflash.loss_gamma == 2
    assert capsys.readouterr().err.splitlines() == [
        "notice: draft.block_size is now draft.dflash.block_size; write draft.dflash.block_size=4 "
        "(the flat spelling is read until the next release)"
    ]
    # the same key reads into another kind's section when that kind is chosen
    assert (
        parse(["train", "draft=eagle3", "draft.num_decoder_layers=1"]).args.draft.eagle.num_decoder_layers
        == 1
    )


def test_a_flat_key_the_chosen_kind_does_not_read_is_refused_as_typed(capsys):
    with pytest.raises(UserError) as e:
        parse(["train", "draft=dflash", "draft.num_layers=2"])
    assert str(e.value) == (
        "draft.num_layers=2 is a key of medusa drafters, and draft.kind=dflash does not read it; "
        "use draft.dflash.num_decoder_layers=2"
    )
    assert capsys.readouterr().err == ""  # refused, not moved: no notice


def test_a_key_its_section_lacks_and_a_section_no_kind_has_are_refused_before_composing():
    with pytest.raises(
        UserError, match=r"^draft.eagle.block_size=4 is a key of dflash drafters.*\(draft=dflash reads it\)$"
    ):
        parse(["train", "draft=eagle3", "draft.eagle.block_size=4"])
    with pytest.raises(
        UserError,
        match=r"^draft.nosuch.depth: draft.nosuch is not a drafter kind's section; the sections are",
    ):
        parse(["train", "draft.nosuch.depth=2"])
    with pytest.raises(
        UserError, match=r"^draft.dflash.depth=2 is not a key of dflash drafters; drop it \(`draftheads"
    ):
        parse(["train", "draft=dflash", "draft.dflash.depth=2"])


def test_a_recipes_section_of_another_kind_is_refused_and_dropped_with_null():
    with pytest.raises(UserError) as e:
        parse(["train", "recipe=llama3.1-8b-eagle3", "draft=peagle", "train.dry_run=true"])
    assert str(e.value).endswith("(a recipe's section is dropped with draft.eagle=null)")
    args = parse(["train", "recipe=llama3.1-8b-eagle3", "draft=peagle", "draft.eagle=null"]).args
    assert args.draft.kind == "peagle" and args.draft.eagle is None and args.draft.peagle is not None


def test_cfg_job_and_help_speak_of_the_chosen_section(capsys):
    assert main(["train", "draft=medusa2", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    draft = out[out.index("draft:") : out.index("\ndata:")]
    assert draft.splitlines()[:3] == ["draft:", "  kind: medusa", "  medusa:"] and "lora: true" in draft
    assert "eagle" not in draft and "null" not in draft


def test_python_builds_a_config_of_one_kind_and_refuses_another_kinds_key():
    d = DraftConfig.of("eagle", version=3, ttt_steps=2)
    assert (d.kind, d.eagle.version, d.ttt_steps, d.medusa, d.dflash) == ("eagle", 3, 2, None, None)
    with pytest.raises(UserError, match=r"^draft.eagle.block_size=8 is a key of dflash drafters"):
        DraftConfig.of("eagle", block_size=8)
    with pytest.raises(AttributeError, match="draft.kind=eagle has no key 'block_size'"):
        _ = d.block_size


FLAT = {  # a run config's draft as the last release saved it: every kind's keys, flat
    "kind": "eagle",
    "version": 3,
    "ttt_steps": 4,
    "num_decoder_layers": 1,
    "num_heads": 4,
    "block_size": 16,
}


def test_a_run_config_saved_flat_reads_in_its_kinds_section():
    nested = nested_draft(FLAT)
    others = {name: None for name in DRAFT_KINDS if name != "eagle"}
    assert nested == {
        "kind": "eagle",
        **others,
        "eagle": {"version": 3, "ttt_steps": 4, "num_decoder_layers": 1},
    }
    assert nested_draft(nested) is nested  # already sectioned


def test_a_resume_compares_a_flat_saved_config_with_todays_in_the_kinds_section():
    now = {"kind": "eagle", **{name: None for name in DRAFT_KINDS}}
    now["eagle"] = {"version": 3, "ttt_steps": 4, "num_decoder_layers": 1}
    assert config_mismatch({"draft": FLAT}, {"draft": now}) is None
    changed = {**now, "eagle": {**now["eagle"], "ttt_steps": 7}}
    assert (
        config_mismatch({"draft": FLAT}, {"draft": changed})
        == "draft.eagle.ttt_steps=4 in the checkpoint, 7 now"
    )
