"""Drafting methods behind one protocol (base.py): each drafter kind's proposer, lookup, and a drafter with lookup.

Each drafter kind's proposer has its own module here, and the kind's record names it
(``proposer``, a dotted path); :func:`build_proposer` builds the one the drafter's kind names (an
unknown kind is one clear error, see docs/kinds.md). A kind's proposer class is answered from its
module when first asked for (``from draftheads.decode.proposers import EagleProposer``), so this
package names no kind.
"""

from __future__ import annotations

from typing import Any

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.conf.schema.kinds import kind_export
from draftheads.decode.proposers.base import (
    Accepted,
    Plan,
    Prefill,
    Proposer,
    Tree,
    proposer_class,
)
from draftheads.decode.proposers.combined import WithLookup
from draftheads.decode.proposers.lookup import LookupProposer
from draftheads.decode.tree import StaticTree

__all__ = [
    "Accepted",
    "LookupProposer",
    "Plan",
    "Prefill",
    "Proposer",
    "Tree",
    "WithLookup",
    "build_proposer",
    "proposer_class",
]


def __getattr__(name: str) -> Any:
    """A kind's proposer class, from the kind's module (``from draftheads.decode.proposers import EagleProposer``)."""
    return kind_export(__name__, name)


def build_proposer(drafter, static: StaticTree | None, cfg: DecodeConfig) -> Proposer:
    """The proposer for a drafter (None: lookup alone), with lookup branches when ``cfg.lookup``."""
    lookup = (
        LookupProposer(cfg.lookup_tokens, cfg.lookup_ngram) if cfg.lookup and cfg.lookup_tokens > 0 else None
    )
    if drafter is None:
        if lookup is None:
            raise ValueError("no drafter and no lookup: nothing proposes drafts")
        return lookup
    inner: Proposer = proposer_class(getattr(drafter, "kind", "")).for_drafter(drafter, static, cfg)
    return WithLookup(inner, lookup) if lookup is not None else inner
