"""The drafters ``draftheads bench`` trains, by bench name: the bench rows of the kinds' records.

``bench.drafters`` lists bench names (``BenchDrafter.name``, the folders and result keys), each a :class:`BenchDrafter` declared in its kind's record (``conf/schema/kinds/<kind>.py``): the
draft overrides that select it and its recipe, what its training reads from a feature cache, and
which of the bench's extra stages it gets. The bench's stages ask these facts instead of testing
names, so a kind gets bench rows by declaring them in its record.

This is the schema layer: the config refuses an unknown bench name when it is read, and the
facts are plain data (the bench, a layer above, does the training they describe).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds import BUILTIN_KINDS
from draftheads.conf.schema.kinds.record import BenchDrafter

if TYPE_CHECKING:
    from draftheads.conf.schema.heads import DraftConfig


def bench_rows() -> dict[str, BenchDrafter]:
    """Every record's bench rows by bench name, in the records' order (a name is taken once; one
    row base among all)."""
    rows: dict[str, BenchDrafter] = {}
    for kind in BUILTIN_KINDS:
        for b in kind.bench:
            if not b.name or b.name in rows or b.kind != kind.name:
                raise ValueError(
                    f"bench drafter {b.name!r} of kind {kind.name!r} is empty, repeated or foreign"
                )
            rows[b.name] = b
    if sum(b.row_base for b in rows.values()) != 1:
        raise ValueError("the kinds' bench rows name no row base, or more than one")
    return rows


# bench name -> its facts, in the order refusals list them
BENCH_DRAFTERS: dict[str, BenchDrafter] = bench_rows()


def bench_drafter(name: str) -> BenchDrafter:
    """The bench drafter ``name``; one line naming the known ones otherwise."""
    if name not in BENCH_DRAFTERS:
        raise UserError(f"bench.drafters: unknown drafter {name!r}; use some of {', '.join(BENCH_DRAFTERS)}")
    return BENCH_DRAFTERS[name]


def bench_drafter_for(d: DraftConfig) -> BenchDrafter | None:
    """The bench drafter that trains ``d``'s kind (and version), or None."""
    return next(
        (
            b
            for b in BENCH_DRAFTERS.values()
            if b.kind == d.kind and (b.version is None or b.version == d.version)
        ),
        None,
    )


def default_drafters() -> list[str]:
    """The bench names ``bench.drafters`` lists by default: the rows their records mark ``default``."""
    return [b.name for b in BENCH_DRAFTERS.values() if b.default]


def row_base() -> BenchDrafter:
    """The bench drafter whose recipe a study row that names no draft group trains on."""
    return next(b for b in BENCH_DRAFTERS.values() if b.row_base)


def lead_drafter(names: list[str]) -> str | None:
    """The first of the bench names ``names`` that can lead the bench (``BenchDrafter.lead``), or None."""
    return next((n for n in names if bench_drafter(n).lead), None)


__all__ = [
    "BENCH_DRAFTERS",
    "BenchDrafter",
    "bench_drafter",
    "bench_drafter_for",
    "lead_drafter",
    "row_base",
]
