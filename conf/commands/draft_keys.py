"""The ``draft.<kind>.<key>`` overrides: each kind's keys live in its section of the draft config.

Before Hydra composes them: a section that is no kind's, or a key its kind lacks, is refused
naming the key that kind reads. After: a section of another kind than the chosen one is refused
whatever its value (``draft=<group> draft.<other kind>.<key>=...``), since the config cannot tell a
section typed with its defaults from one left unset. A flat key (``draft.block_size=4``, the last
release's spelling) is moved into the chosen kind's section with a one-line notice, or refused
naming the key when that kind does not read it.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from draftheads.conf.errors import UserError
from draftheads.conf.schema.flat_keys import flat_draft_key, nested_override
from draftheads.conf.schema.heads import foreign_key_line
from draftheads.conf.schema.kinds import DRAFT_KINDS


def section_override(override: str) -> tuple[str, str, str] | None:
    """``(section, key, value)`` of a ``draft.<section>.<key>=value`` override, else None."""
    key, _, value = override.lstrip("+~").partition("=")
    parts = key.split(".")
    return (parts[1], parts[2], value) if parts[0] == "draft" and len(parts) == 3 else None


def is_draft_key(override: str) -> bool:
    """Whether ``override`` sets a drafter key, flat or in a section (not ``draft.kind`` or ``draft=``)."""
    return bool(flat_draft_key(override) or section_override(override))


def check_section_keys(overrides: list[str]) -> None:
    """Refuse ``draft.<section>.<key>`` where the section is no kind's, or its kind does not read
    the key, naming the key it reads or the kind that reads it (OmegaConf's error names neither)."""
    for item in overrides:
        typed = section_override(item)
        if typed is None:
            continue
        section, key, value = typed
        if section not in DRAFT_KINDS:
            raise UserError(
                f"draft.{section}.{key}: draft.{section} is not a drafter kind's section; the sections "
                f"are {', '.join(f'draft.{k}' for k in DRAFT_KINDS)}, one per draft.kind"
            )
        line = foreign_key_line(section, section, key, value)
        if line:
            raise UserError(line)


def nest_flat_keys(overrides: list[str], kind: str, out: TextIO | None = None) -> list[str]:
    """The overrides with every flat draft key moved into ``kind``'s section, with one notice per
    key on ``out`` (stderr) naming the new spelling; a flat key ``kind`` does not read is refused
    as typed, naming the key it reads if one means the same."""
    nested = []
    for item in overrides:
        leaf = flat_draft_key(item)
        if leaf is None:
            nested.append(item)
            continue
        value = item.partition("=")[2]
        line = foreign_key_line(kind, kind, leaf, value, typed=f"draft.{leaf}")
        if line:
            raise UserError(line)
        new = nested_override(item, kind)
        print(
            f"notice: draft.{leaf} is now draft.{kind}.{leaf}; write {new.lstrip('+~')} "
            "(the flat spelling is read until the next release)",
            file=out or sys.stderr,
        )
        nested.append(new)
    return nested


def other_section_problem(kind: str, overrides: list[str]) -> str | None:
    """The first ``draft.<section>.<key>`` override of another kind's section than ``kind``'s,
    as the line refusing it, or None."""
    for item in overrides:
        typed = section_override(item)
        if typed and typed[0] != kind:
            return foreign_key_line(kind, *typed)
    return None


def compose_draft(overrides: list[str], compose: Any) -> tuple[Any, Any]:
    """``compose(overrides)`` (``(config, DictConfig)``) with the draft keys checked as above;
    the chosen kind is read from a composition without them where it is needed."""
    check_section_keys(overrides)
    others = [o for o in overrides if not is_draft_key(o)]
    if any(flat_draft_key(o) for o in overrides):
        overrides = nest_flat_keys(overrides, compose(others)[0].draft.kind)
    try:
        cfg, dcfg = compose(overrides)
    except UserError:
        if not any(section_override(o) for o in overrides):
            raise
        problem = other_section_problem(compose(others)[0].draft.kind, overrides)
        if problem:
            raise UserError(problem) from None
        raise
    problem = other_section_problem(cfg.draft.kind, overrides)
    if problem:
        raise UserError(problem)
    return cfg, dcfg
