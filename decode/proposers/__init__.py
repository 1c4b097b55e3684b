"""Drafting methods behind one protocol (base.py): Medusa, EAGLE, DFlash, lookup, and a drafter with lookup."""

from __future__ import annotations

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.proposers.base import Accepted, Plan, Prefill, Proposer, Tree
from draftheads.decode.proposers.combined import WithLookup
from draftheads.decode.proposers.dflash import DFlashProposer
from draftheads.decode.proposers.eagle import EagleProposer
from draftheads.decode.proposers.lookup import LookupProposer
from draftheads.decode.proposers.medusa import MedusaProposer
from draftheads.decode.tree import StaticTree

__all__ = [
    "Accepted",
    "DFlashProposer",
    "EagleProposer",
    "LookupProposer",
    "MedusaProposer",
    "Plan",
    "Prefill",
    "Proposer",
    "Tree",
    "WithLookup",
    "build_proposer",
]


def build_proposer(drafter, static: StaticTree | None, cfg: DecodeConfig) -> Proposer:
    """The proposer for a drafter (None: lookup alone), with lookup branches when ``cfg.lookup``."""
    lookup = (
        LookupProposer(cfg.lookup_tokens, cfg.lookup_ngram) if cfg.lookup and cfg.lookup_tokens > 0 else None
    )
    if drafter is None:
        if lookup is None:
            raise ValueError("no drafter and no lookup: nothing proposes drafts")
        return lookup
    inner: Proposer
    if drafter.kind == "medusa":
        inner = MedusaProposer(drafter, static)
    elif drafter.kind == "dflash":
        inner = DFlashProposer(drafter, static, cfg)
    else:
        inner = EagleProposer(drafter, static, cfg)
    return WithLookup(inner, lookup) if lookup is not None else inner
