"""Every drafter kind is one record in one tuple, and every lookup by kind goes through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftheads.conf.errors import UserError
from draftheads.conf.schema.bench_drafters import BENCH_DRAFTERS
from draftheads.conf.schema.kinds import BUILTIN_KINDS, DRAFT_KINDS, DraftKind, kind_names, kind_record
from draftheads.data.outdir import BENCH_FOLDERS
from draftheads.decode.proposers import proposer_class
from draftheads.heads.kinds import KINDS, DrafterKind, drafter_kind
from draftheads.train.modules import Objective, objective_class
from draftheads.train.modules.costs import kind_cost, sized_kinds

DRAFT_GROUPS = Path(__file__).resolve().parent.parent / "conf" / "draft"
NAMES = kind_names()


def test_the_tuple_names_each_kind_once():
    assert NAMES and len(set(NAMES)) == len(NAMES)


@pytest.mark.parametrize("record", BUILTIN_KINDS, ids=NAMES)
def test_every_record_is_complete(record):
    assert isinstance(record.section, DraftKind) and record.section.name == record.name
    facts = record.heads_facts()
    assert issubclass(facts, DrafterKind) and facts.name == record.name
    assert facts.drafter.kind == record.name and facts.title
    assert issubclass(record.objective_class(), Objective)
    assert callable(getattr(record.proposer_class(), "for_drafter", None))
    assert record.groups and all((DRAFT_GROUPS / f"{g}.yaml").is_file() for g in record.groups)
    assert record.bench and all(b.kind == record.name for b in record.bench)
    assert record.folders == tuple(b.name for b in record.bench)


def test_every_lookup_reads_the_records():
    """No registry holds a kind the tuple lacks, nor lacks one it holds."""
    assert list(KINDS) == NAMES
    assert list(DRAFT_KINDS) == NAMES
    assert {b.kind for b in BENCH_DRAFTERS.values()} == set(NAMES)
    assert list(BENCH_DRAFTERS) == [b.name for r in BUILTIN_KINDS for b in r.bench]
    assert all(folder in BENCH_FOLDERS for r in BUILTIN_KINDS for folder in r.folders)
    groups = {g for r in BUILTIN_KINDS for g in r.groups}
    assert groups == {p.stem for p in DRAFT_GROUPS.glob("*.yaml")}
    for record in BUILTIN_KINDS:
        assert drafter_kind(record.name) is KINDS[record.name]
        assert objective_class(record.name) is record.objective_class()
        assert proposer_class(record.name) is record.proposer_class()
        assert kind_cost(record.name) is record.cost_function()
    assert sized_kinds() == [r.name for r in BUILTIN_KINDS if r.cost]


def test_an_unknown_kind_is_one_error_naming_the_known_ones():
    for lookup in (kind_record, drafter_kind, objective_class, proposer_class):
        with pytest.raises(UserError, match="draftheads knows " + ", ".join(NAMES)):
            lookup("nosuch")


def test_nothing_registers_by_being_imported():
    import draftheads.conf.schema.kinds.registry as registry
    import draftheads.decode.proposers.base as proposers
    import draftheads.heads.kinds as heads_kinds
    import draftheads.train.modules.base as objectives
    import draftheads.train.modules.costs as costs

    for module in (registry, proposers, heads_kinds, objectives, costs):
        assert not [name for name in vars(module) if name.startswith("register_")], module.__name__
