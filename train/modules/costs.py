"""What training a drafter costs per row token: the kinds' costs the dry run sizes from, and the
pieces the kinds' formulae share (each kind's formula is its own, beside its objective).

A kind's cost function sits beside its objective (``train/modules/<kind>.py``) and its record
names it (``cost``, a dotted path);
:mod:`draftheads.train.dry_run.sizing` turns the cost into memory per rank and FLOPs per token
(the notation, ``e``, ``S``, ``H``, ``A``, is that module's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.kinds import BUILTIN_KINDS, kind_record
from draftheads.conf.schema.train import TrainConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from draftheads.heads import Drafter


def count(module: nn.Module | None, trainable: bool = False) -> int:
    """Parameters of ``module`` (shared tensors once), or only those that train."""
    if module is None:
        return 0
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable)


def attention_widths(config: PretrainedConfig) -> tuple[int, int]:
    """(query width heads x head_dim, key/value width kv_heads x head_dim) of a layer config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return heads * head_dim, kv * head_dim


def layer_activation(config: PretrainedConfig, element: int) -> int:
    """Bytes one token keeps in one drafter layer for the backward pass: e (4H + 2A + 2KV + 4I)."""
    A, KV = attention_widths(config)
    return element * (4 * config.hidden_size + 2 * A + 2 * KV + 4 * config.intermediate_size)


@dataclass(frozen=True)
class DraftCost:
    """A drafter's cost per row token: FLOPs (forward and backward), activation bytes, and
    whether online training projects the target's logits (its lm_head runs as the teacher)."""

    flops: float
    activation: float
    target_logits: bool = False


# (drafter, draft config, train config, row length S, bytes per element e, online) -> its cost
Cost = Callable[["Drafter", DraftConfig, TrainConfig, int, int, bool], DraftCost]


def sized_kinds() -> list[str]:
    """The drafter kinds a dry run sizes: those whose record names a training cost."""
    return [k.name for k in BUILTIN_KINDS if k.cost]


def kind_cost(kind: str) -> Cost | None:
    """The training cost function the record of ``kind`` names, or None (the dry run does not size it)."""
    return kind_record(kind, "draft.kind").cost_function()
