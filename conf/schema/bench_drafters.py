"""The drafters ``draftheads bench`` trains, by bench name: each one's facts, declared once.

``bench.drafters`` lists bench names (``medusa``, ``eagle``, ``eagle3``, ``dflash``), each a
:class:`BenchDrafter` registered with :func:`register_bench_drafter`: the draft overrides that
select it and its recipe, what its training reads from a feature cache, and which of the bench's
extra stages it gets. The bench's stages ask these facts instead of testing names, so a kind gets
bench rows by declaring one here or beside its draft-config facts (``conf/schema/kinds/<kind>.py``).

This is the schema layer: the config refuses an unknown bench name when it is read, and the
facts are plain data (the bench, a layer above, does the training they describe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from draftheads.conf.errors import UserError

if TYPE_CHECKING:
    from draftheads.conf.schema.heads import DraftConfig

# bench name -> its facts, in the order refusals list them
BENCH_DRAFTERS: dict[str, BenchDrafter] = {}


@dataclass(frozen=True)
class BenchDrafter:
    """One drafter of the bench: how it is selected and trained, and which stages it gets."""

    name: str  # the bench.drafters entry: its folder under bench.out_dir and its results key
    kind: str  # the draft.kind it trains
    draft: tuple[str, ...]  # the overrides that select it ("draft=medusa")
    lr: str  # its learning rate on the bench's recipe
    version: int | None = None  # the draft.version it trains (None: any)
    recipe: tuple[str, ...] = ()  # the rest of its bench recipe, after the learning rate
    # what in-memory training keeps of a cached row: the final state ("last"), every cached
    # layer ("all"), or its config's training layers, a subset of the cache's ("own")
    reads: Literal["last", "all", "own"] = "all"
    offline: bool = True  # it can stream a feature cache from disk (train.features=offline)
    streamed: bool = False  # the main run streams it from the teacher-forced cache (its data and passes)
    steps: str = "eagle_steps"  # the BenchConfig field with its training steps in memory
    tokens: str | None = None  # the BenchConfig field capping its answer tokens of teacher-forced data
    tree: bool = False  # a tree stage chooses its static tree from measured head accuracies
    eagle: bool = False  # it can be the EAGLE drafter: scaling points, workloads, the published tree
    row_base: bool = False  # the recipe a study row naming no draft group trains on (one drafter)
    flops: str = ""  # what the FLOPs its objective logs count, said by train-speed ("": none logged)

    def row(self) -> list[str]:
        """Its overrides on the row base's recipe (none for the row base itself)."""
        return [] if self.row_base else list(self.draft)

    def draft_config(self) -> DraftConfig:
        """The ``DraftConfig`` of its kind and version with the schema's defaults."""
        from draftheads.conf.schema.heads import DraftConfig

        return DraftConfig(kind=self.kind, **({} if self.version is None else {"version": self.version}))


def register_bench_drafter(d: BenchDrafter) -> BenchDrafter:
    """Register ``d`` under its bench name (once; one row base among all)."""
    if not d.name or d.name in BENCH_DRAFTERS:
        raise ValueError(f"bench drafter {d.name!r} is empty or registered twice")
    if d.row_base and any(o.row_base for o in BENCH_DRAFTERS.values()):
        raise ValueError(f"bench drafter {d.name!r}: the row base is registered already")
    BENCH_DRAFTERS[d.name] = d
    return d


def bench_drafter(name: str) -> BenchDrafter:
    """The bench drafter ``name``; one line naming the known ones otherwise."""
    if name not in BENCH_DRAFTERS:
        raise UserError(f"bench.drafters: unknown drafter {name!r}; use some of {', '.join(BENCH_DRAFTERS)}")
    return BENCH_DRAFTERS[name]


def bench_drafter_for(d: DraftConfig) -> BenchDrafter | None:
    """The bench drafter that trains ``d``'s kind (and version), or None."""
    return next(
        (b for b in BENCH_DRAFTERS.values() if b.kind == d.kind and b.version in (None, d.version)), None
    )


def row_base() -> BenchDrafter:
    """The bench drafter whose recipe a study row that names no draft group trains on."""
    return next(b for b in BENCH_DRAFTERS.values() if b.row_base)


def eagle_drafter(names: list[str]) -> str | None:
    """The first of the bench names ``names`` that can be the EAGLE drafter, or None."""
    return next((n for n in names if bench_drafter(n).eagle), None)


register_bench_drafter(
    BenchDrafter(
        "medusa",
        "medusa",
        ("draft=medusa",),
        "1e-3",
        reads="last",
        offline=False,
        steps="medusa_steps",
        tokens="medusa_tokens",
        tree=True,
    )
)
register_bench_drafter(BenchDrafter("eagle", "eagle", ("draft=eagle",), "5e-4", version=1, eagle=True))
register_bench_drafter(
    BenchDrafter(
        "eagle3", "eagle", ("draft=eagle3",), "1e-3", version=3, streamed=True, eagle=True, row_base=True
    )
)
register_bench_drafter(
    BenchDrafter(
        "dflash",
        "dflash",
        ("draft=dflash",),
        "1e-3",
        # EAGLE-3's data, passes and learning rate; 32 blocks per row make a step's matmuls per
        # row token about EAGLE-3's (0.145 against 0.144 GFLOP on the bench's packed rows)
        recipe=("draft.anchors_per_row=32",),
        reads="own",
        streamed=True,
        flops="forward and backward: fc, context keys and values, the block layers and their attention, "
        "the draft head on the counted positions",
    )
)
# P-EAGLE: EAGLE-3's recipe, data and passes, streamed from the teacher-forced cache, reading
# EAGLE-3's layers of it
register_bench_drafter(
    BenchDrafter("peagle", "peagle", ("draft=peagle",), "1e-3", reads="own", streamed=True)
)
