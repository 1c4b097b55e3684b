"""The record of one drafter kind: everything generic code asks about a kind, declared once.

A kind is one :class:`KindRecord`, exported as ``KIND`` by ``conf/schema/kinds/<kind>.py`` and
listed in :data:`draftheads.conf.schema.kinds.BUILTIN_KINDS`. The record names the kind's
pieces in every layer:

* its config section (a :class:`~draftheads.conf.schema.kinds.section.DraftKind`: the dataclass
  of the ``draft.*`` keys it reads, ``schema``, and their checks) and its YAML groups
  (``conf/draft/<group>.yaml``);
* its heads facts (a :class:`~draftheads.heads.kinds.DrafterKind` subclass: the drafter class,
  how a config builds it, its published layouts and their detection, its engine formats and
  export), its training objective and cost, and its decoding proposer;
* its bench rows (:class:`BenchDrafter`), whose names are also the folders ``draftheads bench``
  writes for it, and the overrides that keep a run on a tiny target small.

This is the schema layer, the lowest: the pieces from the layers above (heads, train, decode)
are dotted paths (``"package.module:Name"``), imported when first asked for, so a record imports
no model and the layers' import contracts hold.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.conf.schema.kinds.section import DraftKind


@cache
def load(path: str) -> Any:
    """The object a dotted path ``"package.module:Name"`` names, its module imported on first use."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"{path!r} is not a dotted path of the form 'package.module:Name'")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class BenchDrafter:
    """One drafter of the bench: how it is selected and trained, and which stages it gets."""

    name: str  # the bench.drafters entry: its folder under bench.out_dir and its results key
    kind: str  # the draft.kind it trains
    draft: tuple[str, ...]  # the overrides that select it ("draft=<group>")
    lr: str  # its learning rate on the bench's recipe
    version: int | None = None  # the draft.<kind>.version it trains (None: any)
    recipe: tuple[str, ...] = ()  # the rest of its bench recipe, after the learning rate
    # what in-memory training keeps of a cached row: the final state ("last"), every cached
    # layer ("all"), or its config's training layers, a subset of the cache's ("own")
    reads: Literal["last", "all", "own"] = "all"
    offline: bool = True  # it can stream a feature cache from disk (train.features=offline)
    streamed: bool = False  # the main run streams it from the teacher-forced cache (its data and passes)
    steps: str = "eagle_steps"  # the BenchConfig field with its training steps in memory
    tokens: str | None = None  # the BenchConfig field capping its answer tokens of teacher-forced data
    tree: bool = False  # a tree stage chooses its static tree from measured head accuracies
    # it can lead the bench: the first such main drafter gets the scaling points, the workloads
    # and the published dynamic tree's row
    lead: bool = False
    row_base: bool = False  # the recipe a study row naming no draft group trains on (one drafter)
    flops: str = ""  # what the FLOPs its objective logs count, said by train-speed ("": none logged)
    default: bool = False  # it is in the bench's default bench.drafters

    def row(self) -> list[str]:
        """Its overrides on the row base's recipe (none for the row base itself)."""
        return [] if self.row_base else list(self.draft)

    def draft_config(self) -> DraftConfig:
        """The ``DraftConfig`` of its kind and version with the schema's defaults (``DraftConfig``'s
        module reads the records, so it is loaded by path, when asked)."""
        DraftConfig = load("draftheads.conf.schema.heads:DraftConfig")
        return DraftConfig.of(kind=self.kind, **({} if self.version is None else {"version": self.version}))


@dataclass(frozen=True)
class KindRecord:
    """One drafter kind, declared once: its name and its pieces in every layer."""

    name: str  # the draft.kind value and the kind a drafter's config.json names
    section: DraftKind  # its config facts: the draft.* keys it reads, their checks
    groups: tuple[str, ...]  # its YAML groups, conf/draft/<group>.yaml (selected as "draft=<group>")
    drafter: str  # dotted path of its heads facts, a DrafterKind subclass (drafter class, layouts, export)
    objective: str  # dotted path of its training objective, an Objective subclass
    proposer: str  # dotted path of its decoding proposer (built with ``for_drafter``)
    bench: tuple[BenchDrafter, ...] = ()  # its bench rows, in the order the bench lists them
    # dotted path of what training it costs per row token, the dry run's sizing ("": not sized)
    cost: str = ""
    # per YAML group: the overrides that keep a run on a tiny target small (the architecture matrix)
    small: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def folders(self) -> tuple[str, ...]:
        """The folders ``draftheads bench`` writes for the kind under ``bench.out_dir``: one per bench row."""
        return tuple(b.name for b in self.bench)

    def heads_facts(self) -> Any:
        """Its :class:`~draftheads.heads.kinds.DrafterKind` subclass (imports the heads layer)."""
        return load(self.drafter)

    def objective_class(self) -> Any:
        """Its training objective class (imports the train layer)."""
        return load(self.objective)

    def cost_function(self) -> Any:
        """Its training cost function, or None when the dry run does not size it (imports the train layer)."""
        return load(self.cost) if self.cost else None

    def proposer_class(self) -> Any:
        """Its decoding proposer class (imports the decode layer)."""
        return load(self.proposer)
