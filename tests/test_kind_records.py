"""Every drafter kind is one record in one tuple, and every lookup by kind goes through it."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from draftheads.conf.errors import UserError
from draftheads.conf.schema.bench_drafters import BENCH_DRAFTERS
from draftheads.conf.schema.kinds import BUILTIN_KINDS, DRAFT_KINDS, DraftKind, kind_names, kind_record
from draftheads.conf.schema.kinds.section import section_keys
from draftheads.data.outdir import BENCH_FOLDERS
from draftheads.decode.proposers import proposer_class
from draftheads.heads.kinds import KINDS, DrafterKind, drafter_kind
from draftheads.train.modules import Objective, objective_class
from draftheads.train.modules.costs import kind_cost, sized_kinds

DRAFT_GROUPS = Path(__file__).resolve().parent.parent / "conf" / "draft"
TUPLE = "conf/schema/kinds/__init__.py"  # the one list of kinds: it imports each record by name
NAMES = kind_names()
DRAFT_GROUPS_NAMES = {g for record in BUILTIN_KINDS for g in record.groups}


def test_the_tuple_names_each_kind_once():
    assert NAMES and len(set(NAMES)) == len(NAMES)


@pytest.mark.parametrize("record", BUILTIN_KINDS, ids=NAMES)
def test_every_record_is_complete(record):
    assert isinstance(record.section, DraftKind) and record.section.name == record.name
    assert dataclasses.is_dataclass(record.section.schema)
    assert record.section.keys == section_keys(record.section.schema)
    facts = record.heads_facts()
    assert issubclass(facts, DrafterKind) and facts.name == record.name
    assert facts.drafter.kind == record.name and facts.title
    assert issubclass(record.objective_class(), Objective)
    assert callable(getattr(record.proposer_class(), "for_drafter", None))
    assert record.groups and all((DRAFT_GROUPS / f"{g}.yaml").is_file() for g in record.groups)
    assert record.bench and all(b.kind == record.name for b in record.bench)
    assert record.folders == tuple(b.name for b in record.bench)


def test_the_draft_config_holds_the_chosen_kinds_section_only():
    """``draft.*`` holds ``kind`` and one section per kind, named by it: the chosen kind's is set
    (its defaults), the others are None, and the config reads its section's keys as its own."""
    from draftheads.conf.schema.heads import DraftConfig

    assert [f.name for f in dataclasses.fields(DraftConfig)] == ["kind", *NAMES]
    for record in BUILTIN_KINDS:
        d = DraftConfig(kind=record.name)
        assert d.section == record.section.schema()
        assert [n for n in NAMES if getattr(d, n) is not None] == [record.name]
        assert all(getattr(d, key) == getattr(d.section, key) for key in record.section.keys)
        other = next(k for r in BUILTIN_KINDS for k in r.section.keys if k not in record.section.keys)
        with pytest.raises(AttributeError, match=f"draft.kind={record.name} has no key '{other}'"):
            getattr(d, other)


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
    import draftheads.conf.schema.kinds.section as section
    import draftheads.decode.proposers.base as proposers
    import draftheads.heads.kinds as heads_kinds
    import draftheads.train.modules.base as objectives
    import draftheads.train.modules.costs as costs

    for module in (section, proposers, heads_kinds, objectives, costs):
        assert not [name for name in vars(module) if name.startswith("register_")], module.__name__


def test_a_typed_key_of_another_kind_is_refused_whatever_its_value():
    from draftheads.conf.cli import parse

    with pytest.raises(UserError, match="use draft.dflash.num_decoder_layers=1"):
        parse(["train", "draft=dflash", "draft.medusa.num_layers=1"])  # 1 is Medusa's default
    with pytest.raises(UserError, match=r"drop it \(draft=dflash reads it\)"):
        parse(["train", "draft=eagle3", "draft.dflash.block_size=16"])
    assert (
        parse(["train", "draft=dflash", "draft.dflash.num_decoder_layers=1"]).args.draft.num_decoder_layers
        == 1
    )


def test_the_records_overrides_write_keys_in_their_kinds_section():
    """Every override a record holds (its bench rows, a tiny target's small run) and the study's
    ablation rows use ``draft.<kind>.<key>``: the flat spelling would print a notice on every run."""
    from bench.lab.ablation_rows import ABLATIONS
    from draftheads.conf.schema.flat_keys import flat_draft_key

    overrides = [o for r in BUILTIN_KINDS for b in r.bench for o in (*b.draft, *b.recipe)]
    overrides += [o for r in BUILTIN_KINDS for small in r.small.values() for o in small]
    overrides += [o for row in ABLATIONS.values() for o in row]
    assert overrides and not [o for o in overrides if flat_draft_key(o)]


def test_help_lists_the_chosen_kinds_draft_keys_only():
    from draftheads.conf.cli import command_help

    for record in BUILTIN_KINDS:
        text = command_help("train", [f"draft={record.groups[0]}"])
        listed = {
            line.split(" = ")[0].strip().removeprefix("draft.")
            for line in text.splitlines()
            if line.strip().startswith("draft.") and " = " in line
        }
        assert listed == {"kind", *(f"{record.name}.{key}" for key in record.section.keys)}, record.name


def named_on_purpose() -> set[tuple[str, str]]:
    """Words generic modules hold that are another project's, not a kind's: the speculators model
    types draftheads refuses to read (``UNMAPPED``) are speculators' vocabulary, whatever kinds
    draftheads has (speculators' ``mtp`` type reuses a target's own MTP layers)."""
    from draftheads.heads.speculators import UNMAPPED

    return {("heads/speculators.py", t) for t in UNMAPPED}


def own_file(parts: tuple[str, ...], names: set[str]) -> bool:
    """A kind's own file: its folder under heads/, or its module in a per-kind package."""
    if parts[0] == "heads" and len(parts) > 2 and parts[1] in names:
        return True
    per_kind = {("train", "modules"), ("decode", "proposers"), ("conf", "schema", "kinds")}
    return parts[:-1] in per_kind and kind_module(parts[-1].removesuffix(".py"), names)


def kind_module(stem: str, names: set[str]) -> bool:
    """A module named for a kind: ``dflash``, or one of its parts, ``dflash_checks``."""
    return stem in names or stem.split("_")[0] in names


def kind_imports(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import of a kind's own module or folder (``draftheads.heads.eagle``)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        modules = (
            [n.module or ""]
            if isinstance(n, ast.ImportFrom)
            else [a.name for a in n.names]
            if isinstance(n, ast.Import)
            else []
        )
        found += [
            (n.lineno, m)
            for m in modules
            if m.startswith("draftheads.") and any(kind_module(p, names) for p in m.split(".")[1:])
        ]
    return found


def kind_words(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every kind or group name written as a word anywhere in ``source``, in any
    letter case: code, strings, comments and docstrings alike, as ``grep -iw`` finds them
    (``draft.<name>.key`` and ``EAGLE-3`` hold the word, ``<name>_steps`` and ``EagleDrafter`` do not)."""
    word = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b", re.IGNORECASE)
    return [
        (i, m.group(1).lower()) for i, line in enumerate(source.splitlines(), 1) for m in word.finditer(line)
    ]


def generic_modules(names: set[str]) -> list[tuple[str, str]]:
    """(path, source) of every installed module that is no kind's own file nor the tuple
    (bench/lab, the maintainers' study, aside)."""
    root = DRAFT_GROUPS.parent.parent
    found = []
    for top in ("conf", "heads", "decode", "train", "data", "bench"):
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).parts
            if "lab" not in parts and not own_file(parts, names) and "/".join(parts) != TUPLE:
                found.append(("/".join(parts), path.read_text()))
    return found


def test_no_generic_module_names_a_kind():
    """A kind's name appears in its own files, the tuple and the docs, not in generic code: not in
    a string, a name, a comment or a docstring."""
    names, allowed = set(NAMES) | DRAFT_GROUPS_NAMES, named_on_purpose()
    found = [
        f"{rel}:{line}: {name!r}"
        for rel, source in generic_modules(names)
        for line, name in kind_words(source, names)
        if (rel, name) not in allowed
    ]
    assert not found, "\n".join(found)


def test_no_generic_module_imports_a_kinds_module():
    """Generic code reaches a kind through its record (dotted paths, loaded when asked for): it
    imports no kind's folder or module; the layers' packages answer a kind's public names lazily."""
    names = set(NAMES)
    found = [
        f"{rel}:{line}: {module}"
        for rel, source in generic_modules(names)
        for line, module in kind_imports(source, names)
    ]
    assert not found, "\n".join(found)
    from draftheads.heads import EagleDrafter
    from draftheads.train.modules import Medusa2Objective

    assert EagleDrafter.__module__ == "draftheads.heads.eagle.model"
    assert Medusa2Objective.__module__ == "draftheads.train.modules.medusa"


def test_cfg_job_prints_the_chosen_kinds_draft_keys_only(capsys):
    from draftheads.conf.cli import main

    assert main(["train", "draft=dflash", "draft.dflash.block_size=4", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert (
        "kind: dflash" in out and "block_size: 4" in out and "num_heads" not in out and "ttt_steps" not in out
    )
