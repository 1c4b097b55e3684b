"""The built-in drafter kinds, one record each (:class:`~draftheads.conf.schema.kinds.record.KindRecord`),
and the lookups every layer asks them through.

:data:`BUILTIN_KINDS` is the one list of kinds, in the order messages list them: a kind is known
because its record is in this tuple, never because a module was imported. The other layers'
lookups (the heads facts, the objectives, the proposers, the bench rows, the output folders) read
the records, so no registry can hold a kind this tuple lacks.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds import dflash, eagle, medusa, mtp, peagle
from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord, load
from draftheads.conf.schema.kinds.section import DraftKind

BUILTIN_KINDS: tuple[KindRecord, ...] = (medusa.KIND, eagle.KIND, dflash.KIND, peagle.KIND, mtp.KIND)

# kind name -> its config section (the draft.* keys it reads and its checks)
DRAFT_KINDS: dict[str, DraftKind] = {k.name: k.section for k in BUILTIN_KINDS}


def kind_names() -> list[str]:
    """The built-in kinds' names, in the tuple's order."""
    return [k.name for k in BUILTIN_KINDS]


def kind_record(name: str, where: str = "drafter kind") -> KindRecord:
    """The record of kind ``name``; one clear error naming the known kinds otherwise."""
    for k in BUILTIN_KINDS:
        if k.name == name:
            return k
    raise UserError(f"{where} {name!r} is unknown; draftheads knows {', '.join(kind_names())}")


def draft_kind(name: str) -> DraftKind:
    """The config section of kind ``name``; KeyError otherwise (``DraftConfig`` refuses unknown kinds first)."""
    return DRAFT_KINDS[name]


def unknown_kind_problem(name: object) -> str | None:
    """One line for a ``draft.kind`` that no record declares, naming the known ones, else None."""
    if name in DRAFT_KINDS:
        return None
    return f"draft.kind={name!r} is unknown; use one of {', '.join(DRAFT_KINDS)}"


def kind_export(package: str, name: str) -> Any:
    """``name`` from the kinds' own modules in ``package`` (``draftheads.heads``: each kind's
    folder; ``draftheads.train.modules``, ``draftheads.decode.proposers``: each kind's module), as
    the package's ``__getattr__`` answers ``from draftheads.heads import EagleDrafter``: a kind's
    public names stay importable from its layer's package, which names no kind. A module's public
    names are its ``__all__``, else the classes it defines. Imports only the modules it looks in."""
    for record in BUILTIN_KINDS:
        for path in (record.drafter, record.objective, record.proposer):
            module_name = path.partition(":")[0]
            if not module_name.startswith(f"{package}."):
                continue
            module = importlib.import_module(f"{package}.{module_name[len(package) + 1 :].split('.')[0]}")
            public = getattr(module, "__all__", None) or [
                n for n, v in vars(module).items() if inspect.isclass(v) and v.__module__ == module.__name__
            ]
            if name in public:
                return getattr(module, name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


def depth_problem(d: Any, num_layers: int) -> str | None:
    """Why the drafter ``d`` (a ``DraftConfig``) of ``draft.<kind>.num_decoder_layers`` decoder layers
    makes no sense for a target of ``num_layers`` layers (it would be deeper, so drafting would
    cost more than the target's own step), or None; a kind without decoder layers has none."""
    facts = draft_kind(d.kind)
    if not facts.decoder_layers or d.num_decoder_layers <= num_layers:
        return None
    depth = d.num_decoder_layers
    engines = facts.depth_note(d)
    return (
        f"draft.{d.kind}.num_decoder_layers={depth} is more than the target's {num_layers} layers, so drafting "
        f"would cost more than the target's own step; use at most {num_layers}{engines}"
    )


__all__ = [
    "BUILTIN_KINDS",
    "BenchDrafter",
    "DRAFT_KINDS",
    "DraftKind",
    "KindRecord",
    "depth_problem",
    "draft_kind",
    "kind_export",
    "kind_names",
    "kind_record",
    "load",
    "unknown_kind_problem",
]
