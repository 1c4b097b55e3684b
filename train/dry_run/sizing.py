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
  for each of the drafter's query tokens per row token (as many as its kind's cost counts: its
  unrolled steps, its block positions per row token, or its kept group entries),
  ``e (4H + 2A + 2KV + 4I)`` per drafter layer (two norm inputs, the normed input, q, k, v,
  attention output, the MLP input and its four I-wide tensors) plus ``8 Vd`` for the fp32 logits
  and their softmax; plus the fused features (``e K H``) and, online, the target's fp32 logits
  (``4 V``) when the drafter learns their softmax (the cost's ``target_logits``);
* target weights per rank: ``e`` times its parameters, divided over ``recipe.devices`` when
  ``target.device_map`` spreads it (one process), whole on every rank otherwise;
* FLOPs per row token: a matmul of ``W`` weights costs ``2 W`` forward and ``4 W`` backward
  (``2 W`` when its weight is frozen, as the target's lm_head that a drafter reads), causal
  attention ``2 S A`` per layer forward; the target's forward is counted when features are online.

Each kind's cost sits in its objective's module and its record names it (the formulae's shared
pieces are in :mod:`draftheads.train.modules.costs`); the kinds the dry run sizes are those whose
record names one, and the drafter is built as the kind's heads facts build it (:meth:`~draftheads.heads.kinds.DrafterKind.build`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.recipe import TargetShape
from draftheads.train.engine import zero_stage
from draftheads.train.modules.costs import count, kind_cost, sized_kinds

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from draftheads.heads import Drafter


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
    from draftheads.heads.target.fingerprint import TargetFingerprint

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


EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "top_k_experts")


def active_params(target: nn.Module, config: PretrainedConfig) -> int:
    """The parameters a token runs through: all of them, except that a mixture of E routed
    experts of which each token takes k counts k / E of its expert weights (shared experts whole)."""
    E = next((getattr(config, k) for k in EXPERTS if getattr(config, k, None)), None)
    k = next((getattr(config, k) for k in EXPERTS_PER_TOKEN if getattr(config, k, None)), None)
    total = 0.0
    for name, p in target.named_parameters():
        routed = E and k and ".experts." in name and "shared_expert" not in name
        total += p.numel() * (k / E if routed else 1)
    return int(total)


def target_flops(shape: TargetShape, params: int, S: int, logits: bool) -> float:
    """The target's forward per token: 2 x the layer weights it runs (``params``: active ones,
    :func:`active_params`), causal attention 2 S A per layer, and its lm_head when its logits
    are the labels."""
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
    cost_of = kind_cost(d.kind)
    if cost_of is None:
        raise UserError(
            f"draft.kind={d.kind} has no training cost to size; the dry run sizes {', '.join(sized_kinds())}"
        )
    cost = cost_of(drafter, d, t, S, element, online)
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
        target_flops=target_flops(shape, active_params(target, target.config), S, cost.target_logits)
        if online
        else 0.0,
        cache_bytes_per_token=0.0 if online else cache_bytes(cfg),
    )


def cache_bytes(cfg: Config) -> int:
    """Feature-cache bytes per token: every layer the drafter trains on, plus the top-k ids and
    logits (4 B each)."""
    f, shape = cfg.data.features, cfg.recipe.shape
    layers = cfg.draft.training_layers(shape.num_hidden_layers)
    return (4 if f.dtype == "float32" else 2) * len(layers) * shape.hidden_size + 8 * f.topk
