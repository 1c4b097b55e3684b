"""What a recipe's real run needs, sized on the ``meta`` device from ``recipe.shape``.

The real target and drafter are built from the target's ``config.json`` numbers on the
``meta`` device (nothing is downloaded, no memory is used), their parameters counted, and the
memory per rank and FLOPs per row token computed from the formulae below.

Sizes (``e`` bytes per element: 2 for bf16, 4 for fp32; ``N`` ZeRO ranks; ``P`` trainable
parameters; ``S`` = ``data.max_length``, ``m`` = ``train.micro_batch_size``; rows taken full):

* optimizer states per rank: fp32 master weights (bf16 only) and Adam's m and v,
  ``(4 + 4 + 4) P`` bytes (``8 P`` in fp32), divided by N from ZeRO-1 on;
* drafter weights and gradients per rank: ``e P`` each, gradients / N from ZeRO-2, weights / N at ZeRO-3;
* activations per rank: ``m S`` times the bytes one row token keeps for the backward pass:
  for each of the drafter's query tokens per row token (EAGLE: ``ttt_steps``; DFlash:
  ``anchors_per_row x block_size / S``; P-EAGLE: its group's entries kept by conditional drop), ``e (4H + 2A + 2KV + 4I)`` per drafter layer (two norm
  inputs, the normed input, q, k, v, attention output, the MLP input and its four I-wide
  tensors) plus ``8 Vd`` for the fp32 logits and their softmax; plus the fused features
  (``e K H``) and, online, the target's fp32 logits (``4 V``) when EAGLE learns their softmax;
* target weights per rank: ``e`` times its parameters, divided over ``recipe.devices`` when
  ``target.device_map`` spreads it (one process), whole on every rank otherwise;
* FLOPs per row token: a matmul of ``W`` weights costs ``2 W`` forward and ``4 W`` backward
  (``2 W`` when its weight is frozen, as the target's lm_head a DFlash drafter reads), causal
  attention ``2 S A`` per layer forward; the target's forward is counted when features are online.

Each kind's cost registers with :func:`register_cost` (EAGLE's and DFlash's here, others in their
objective's module); the kinds the dry run sizes are those registered, and the drafter is built
as the kind registry builds it (:meth:`~draftheads.heads.kinds.DrafterKind.build`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.recipe import TargetShape
from draftheads.conf.schema.train import TrainConfig
from draftheads.train.engine import zero_stage

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from draftheads.heads import DFlashDrafter, Drafter, EagleDrafter


@dataclass(frozen=True)
class Needs:
    """What the real run needs: counts in parameters, memory in bytes per rank, FLOPs per row token."""

    target_params: int
    drafter_params: int
    trainable_params: int
    ranks: int
    optimizer_bytes: float
    weights_grads_bytes: float
    activation_bytes: float
    target_bytes: float
    drafter_flops: float
    target_flops: float
    cache_bytes_per_token: float

    @property
    def flops_per_token(self) -> float:
        return self.drafter_flops + self.target_flops


def target_config(shape: TargetShape) -> PretrainedConfig:
    """The transformers config of the real target, from the recipe's shape numbers."""
    from transformers import CONFIG_MAPPING, AutoConfig

    if shape.model_type not in CONFIG_MAPPING:
        raise UserError(
            f"recipe.shape.model_type={shape.model_type} is not a transformers model type; "
            "copy model_type from the target's config.json (e.g. llama, qwen3)"
        )
    try:
        return AutoConfig.for_model(shape.model_type, **shape.config_dict())
    except Exception as e:  # transformers' config validators: one line naming their complaint
        detail = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        raise UserError(
            f"recipe.shape does not make a {shape.model_type} config ({detail[-1]}); "
            "copy the numbers from the target's config.json"
        ) from None


def meta_target(shape: TargetShape) -> nn.Module:
    """The real target's module tree on the meta device (shapes only, no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(target_config(shape))


def meta_drafter(d: DraftConfig, shape: TargetShape, name: str) -> Drafter:
    """The recipe's drafter for the real target, on the meta device, as its kind builds it
    (no tokenizer: a mask token, where one is needed, is the last id)."""
    from draftheads.heads import drafter_kind
    from draftheads.heads.target_fingerprint import TargetFingerprint

    config = target_config(shape)
    fp = TargetFingerprint(
        name=name,
        architecture=(config.architectures or [shape.model_type])[0],
        hidden_size=shape.hidden_size,
        vocab_size=shape.vocab_size,
        num_layers=shape.num_hidden_layers,
        tokenizer_hash="",
        model_type=shape.model_type,
    )
    with torch.device("meta"):
        return drafter_kind(d.kind).build(d, fp, config.to_dict(), None)


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
COSTS: dict[str, Cost] = {}


def register_cost(kind: str) -> Callable[[Cost], Cost]:
    """Decorator: ``fn`` sizes the training of drafters of ``kind`` (the dry run sizes those)."""

    def register(fn: Cost) -> Cost:
        COSTS[kind] = fn
        return fn

    return register


def sized_kinds() -> list[str]:
    """The drafter kinds a dry run sizes: those whose cost is registered (EAGLE's and DFlash's
    here; importing :mod:`draftheads.train.modules` registers the others')."""
    return list(COSTS)


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


@register_cost("eagle")
def eagle_training(drafter, d: DraftConfig, t: TrainConfig, S: int, element: int, online: bool) -> DraftCost:
    """EAGLE's token loss reads the target's logits, projected online unless they are cached (top-k)."""
    return eagle_cost(drafter, d, S, element, online and t.soft_labels != "topk")


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


@register_cost("dflash")
def dflash_training(drafter, d: DraftConfig, t: TrainConfig, S: int, element: int, online: bool) -> DraftCost:
    """DFlash learns from the data's tokens (or cached top-k): no target logits."""
    return dflash_cost(drafter, d, S, element)


def target_flops(shape: TargetShape, params: int, S: int, logits: bool) -> float:
    """The target's forward per token: 2 x its layer weights, causal attention 2 S A per layer,
    and its lm_head when its logits are the labels."""
    V, H = shape.vocab_size, shape.hidden_size
    body = params - V * H * (1 if shape.tie_word_embeddings else 2)
    return 2 * body + 2 * shape.num_hidden_layers * S * shape.attention_dim + (2 * H * V if logits else 0)


def optimizer_bytes(trainable: int, stage: int, ranks: int, bf16: bool) -> float:
    """Adam's fp32 m and v, plus fp32 master weights under bf16, sharded over ranks from ZeRO-1."""
    states = (12 if bf16 else 8) * trainable
    return states / ranks if stage >= 1 else states


def weights_grads_bytes(trainable: int, stage: int, ranks: int, element: int) -> float:
    """The drafter's working weights and gradients: gradients sharded from ZeRO-2, weights at ZeRO-3."""
    grads = element * trainable / (ranks if stage >= 2 else 1)
    weights = element * trainable / (ranks if stage >= 3 else 1)
    return grads + weights


def real_needs(cfg: Config) -> Needs:
    """What the recipe's real run needs, from ``recipe.shape`` (see the module docstring)."""
    shape, d, t = cfg.recipe.shape, cfg.draft, cfg.train
    stage = zero_stage(cfg.deepspeed)
    sharded = cfg.target.device_map is not None
    ranks = 1 if sharded else cfg.recipe.devices
    element = 2 if t.precision == "bf16" else 4
    online, S = t.features == "online", cfg.data.max_length
    target = meta_target(shape)
    target_params = count(target)
    drafter = meta_drafter(d, shape, cfg.target.name_or_path)
    trainable = count(drafter, trainable=True)
    if d.kind not in COSTS:
        raise UserError(
            f"draft.kind={d.kind} has no training cost to size; the dry run sizes {', '.join(COSTS)}"
        )
    cost = COSTS[d.kind](drafter, d, t, S, element, online)
    target_element = 4 if cfg.target.dtype in ("float32", "fp32") else 2
    return Needs(
        target_params=target_params,
        drafter_params=count(drafter),
        trainable_params=trainable,
        ranks=ranks,
        optimizer_bytes=optimizer_bytes(trainable, stage, ranks, t.precision == "bf16"),
        weights_grads_bytes=weights_grads_bytes(trainable, stage, ranks, element),
        activation_bytes=t.micro_batch_size * S * cost.activation,
        target_bytes=target_element * target_params / (cfg.recipe.devices if sharded else 1),
        drafter_flops=cost.flops,
        target_flops=target_flops(shape, target_params, S, cost.target_logits) if online else 0.0,
        cache_bytes_per_token=0.0 if online else cache_bytes(cfg),
    )


def cache_bytes(cfg: Config) -> int:
    """Feature-cache bytes per token: every layer the drafter trains on, plus the top-k ids and
    logits (4 B each)."""
    f, shape = cfg.data.features, cfg.recipe.shape
    layers = cfg.draft.training_layers(shape.num_hidden_layers)
    return (4 if f.dtype == "float32" else 2) * len(layers) * shape.hidden_size + 8 * f.topk
