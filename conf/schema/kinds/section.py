"""The config section of a drafter kind: a dataclass of the ``draft.*`` keys it reads (their
defaults and meaning) and its own value checks, declared once in ``conf/schema/kinds/<kind>.py``
and held by the kind's record
(:class:`~draftheads.conf.schema.kinds.record.KindRecord`).

This is the schema layer (below heads), so it knows no model: only what a ``DraftConfig`` of the
kind means (see docs/kinds.md for adding a kind).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar


@dataclass
class DecoderLayers:
    """The ``draft.*`` keys of a drafter built of decoder layers over target features; the section
    of every kind that builds one extends it."""

    num_decoder_layers: int = 1
    # the target layers the drafter reads (ids index the target's hidden_states; null: the kind's rule)
    feature_layers: list[int] | None = None
    # the draft head's vocabulary: the target's lm_head rows of the most frequent answer tokens (null: all)
    draft_vocab_size: int | None = None
    # start the decoder layer(s) as the target's last layer(s); q/k/v widened to read the embedding
    # beside the features hold the target's weights in the feature half and zeros in the embedding half
    init_from_target: bool = False


def section_keys(schema: type) -> tuple[str, ...]:
    """The ``draft.*`` keys a section dataclass declares, in its order."""
    return tuple(f.name for f in fields(schema))


class DraftKind:
    """The config facts of one drafter kind; subclass it in ``conf/schema/kinds/<kind>.py``."""

    name: ClassVar[str] = ""
    schema: ClassVar[type]  # its section: a dataclass of the draft.* keys it reads, their defaults
    keys: ClassVar[tuple[str, ...]] = ()  # its section's keys (section_keys(schema)); the others it ignores
    options: ClassVar[str] = ""  # the options that select it: "draft=<group> or draft=<group>"
    decoder_layers: ClassVar[bool] = True  # it has decoder layers (draft.<kind>.num_decoder_layers)
    # another kind's key -> this kind's key of the same meaning
    same_meaning: ClassVar[dict[str, str]] = {}
    # its integer keys' least values, and its keys that must not be negative (checked before :meth:`problem`)
    minimums: ClassVar[dict[str, int]] = {}
    non_negative: ClassVar[tuple[str, ...]] = ()

    def problem(self, d: Any) -> str | None:
        """The first nonsensical value of this kind's keys, as one line naming the key, or None."""
        return None

    def train_problem(self, d: Any, t: Any) -> str | None:
        """What training (``t``: the TrainConfig) this kind refuses in ``d``, beyond :meth:`problem`, or None."""
        return None

    def training_layers(self, d: Any, num_layers: int) -> list[int]:
        """Target hidden states a drafter of this shape trains on: what a feature cache holds."""
        return [num_layers]

    def depth_note(self, d: Any) -> str:
        """Said after a refused ``draft.<kind>.num_decoder_layers`` (what the engines serve), or ""."""
        return ""

    def topk_labels(self, d: Any) -> str:
        """What cached top-k logits are to this drafter's loss: ``"learns"`` (it trains on them),
        ``"full"`` (it needs the full distribution, which top-k would cut) or ``"ignores"``."""
        return "ignores"

    def serving_note(self, d: Any) -> str | None:
        """The dry run's line on how the engines serve a drafter of this shape, or None."""
        return None


def bounds_problem(section: DraftKind, d: Any) -> str | None:
    """The first of ``section``'s keys below its least value (``minimums``) or negative
    (``non_negative``) in ``d``, as one line naming the key, or None."""
    for key, low in section.minimums.items():
        if getattr(d, key) < low:
            return f"draft.{d.kind}.{key}={getattr(d, key)} must be at least {low}"
    for key in section.non_negative:
        if getattr(d, key) < 0:
            return f"draft.{d.kind}.{key}={getattr(d, key)} must not be negative"
    return None


def draft_vocab_problem(d: Any) -> str | None:
    """A ``draft.<kind>.draft_vocab_size`` below 1 (null: the full target vocabulary), or None."""
    if d.draft_vocab_size is not None and d.draft_vocab_size < 1:
        return (
            f"draft.{d.kind}.draft_vocab_size={d.draft_vocab_size} must be at least 1; "
            "use null for the full target vocabulary"
        )
    return None
