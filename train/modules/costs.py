"""What training a drafter costs per row token: the kinds' costs the dry run sizes from, and the
pieces the kinds' formulae share.

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

    from draftheads.heads import DFlashDrafter, Drafter, EagleDrafter


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


def eagle_cost(
    drafter: EagleDrafter, d: DraftConfig, S: int, element: int, online: bool, steps: float | None = None
) -> DraftCost:
    """EAGLE: fc once per token, then ``steps`` (default ``ttt_steps``) passes of the layers and
    the head per token.

    flops = 6 fc + T (6 layers + 6 S A n + (6 if the head trains else 4) H Vh)
    """
    T, H = d.ttt_steps if steps is None else steps, drafter.target_fingerprint.hidden_size
    A, _ = attention_widths(drafter.layer_config)
    n = len(drafter.layers)
    own_head = getattr(drafter, "lm_head", None)  # EAGLE-3 trains its own; EAGLE-1 reads the target's
    vocab = own_head.out_features if own_head is not None else drafter.target_fingerprint.vocab_size
    head_factor = 6 if own_head is not None else 4
    flops = 6 * count(drafter.fc) + T * (6 * count(drafter.layers) + 6 * S * A * n + head_factor * H * vocab)
    per_query = n * layer_activation(drafter.layer_config, element) + 8 * vocab
    widened = element * 2 * H if d.version == 3 else 0  # q/k/v read concat(embedding, feature)
    teacher = 4 * drafter.target_fingerprint.vocab_size if online else 0
    activation = T * (per_query + widened) + element * drafter.fc.in_features + teacher
    return DraftCost(flops, activation, online)


def dflash_cost(drafter: DFlashDrafter, d: DraftConfig, S: int, element: int) -> DraftCost:
    """DFlash: the context keys/values of every row token, then ``anchors x block`` query tokens
    per row through the layers and the frozen head.

    flops = 6 (fc + 2 H KV n) + q (6 layers + 12 n (S/2 + b) A + 4 H Vd),  q = anchors b / S
    """
    H, b = drafter.target_fingerprint.hidden_size, d.block_size
    A, KV = attention_widths(drafter.layer_config)
    n = len(drafter.layers)
    q = d.anchors_per_row * b / S if d.anchors_per_row else b  # 0: a block at every position (at most)
    context = count(drafter.fc) + 2 * H * KV * n
    query = 6 * count(drafter.layers) + 12 * n * (S / 2 + b) * A + 4 * H * drafter.draft_vocab_size
    flops = 6 * context + q * query
    per_query = n * layer_activation(drafter.layer_config, element) + 8 * drafter.draft_vocab_size
    activation = q * per_query + element * (drafter.fc.in_features + H + 2 * KV * n)
    return DraftCost(flops, activation)
