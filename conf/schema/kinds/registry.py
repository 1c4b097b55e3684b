"""The draft-config side of the drafter-kind registry: per kind, the ``draft.*`` keys it reads and
its own value checks, declared once in ``conf/schema/kinds/<kind>.py``.

This is the schema layer (below heads), so it knows no model: only what a ``DraftConfig`` of the
kind means. An unknown ``draft.kind`` is refused here, when the config is read, naming the kinds
registered (see docs/kinds.md for adding one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

DRAFT_KINDS: dict[str, DraftKind] = {}


class DraftKind:
    """The config facts of one drafter kind; subclass it with :func:`register_draft_kind`."""

    name: ClassVar[str] = ""
    keys: ClassVar[tuple[str, ...]] = ()  # the draft.* keys it reads (the others it ignores)
    options: ClassVar[str] = ""  # the options that select it: "draft=eagle or draft=eagle3"
    decoder_layers: ClassVar[bool] = True  # it has decoder layers (draft.num_decoder_layers)
    # another kind's key -> this kind's key of the same meaning
    same_meaning: ClassVar[dict[str, str]] = {}

    def problem(self, d: Any) -> str | None:
        """The first nonsensical value of this kind's keys, as one line naming the key, or None."""
        return None

    def train_problem(self, d: Any, t: Any) -> str | None:
        """What training (``t``: the TrainConfig) this kind refuses in ``d``, beyond :meth:`problem`, or None."""
        return None

    def training_layers(self, d: Any, num_layers: int) -> list[int]:
        """Target hidden states a drafter of this shape trains on: what a feature cache holds."""
        return [num_layers]

    def depth_note(self, version: int) -> str:
        """Said after a refused ``draft.num_decoder_layers`` (what the engines serve), or ""."""
        return ""

    def topk_labels(self, d: Any) -> str:
        """What cached top-k logits are to this drafter's loss: ``"learns"`` (it trains on them),
        ``"full"`` (it needs the full distribution, which top-k would cut) or ``"ignores"``."""
        return "ignores"

    def serving_note(self, d: Any) -> str | None:
        """The dry run's line on how the engines serve a drafter of this shape, or None."""
        return None


def register_draft_kind(cls: Callable[[], DraftKind]) -> Any:
    """Class decorator: register one instance of ``cls`` under ``cls.name``."""
    if not cls.name or cls.name in DRAFT_KINDS:
        raise ValueError(f"draft kind {cls.name!r} is empty or registered twice")
    DRAFT_KINDS[cls.name] = cls()
    return cls


def draft_kind(name: str) -> DraftKind:
    """The registered kind ``name``; KeyError otherwise (``DraftConfig`` refuses unknown kinds first)."""
    return DRAFT_KINDS[name]


def unknown_kind_problem(name: Any) -> str | None:
    """One line for a ``draft.kind`` no kind registered, naming the known ones, else None."""
    if name in DRAFT_KINDS:
        return None
    return f"draft.kind={name!r} is unknown; use one of {', '.join(DRAFT_KINDS)}"


def depth_problem(kind: str, version: int, depth: int, num_layers: int) -> str | None:
    """Why an EAGLE or DFlash drafter of ``depth`` decoder layers makes no sense for a target of
    ``num_layers`` layers (it would be deeper, so drafting would cost more than the target's own
    step), or None. Medusa heads have no decoder layers."""
    facts = draft_kind(kind)
    if not facts.decoder_layers or depth <= num_layers:
        return None
    engines = facts.depth_note(version)
    return (
        f"draft.num_decoder_layers={depth} is more than the target's {num_layers} layers, so drafting "
        f"would cost more than the target's own step; use at most {num_layers}{engines}"
    )
