"""``train.dry_run=true``: try a recipe on any machine, and size its real run.

The dry run builds the real drafter on the ``meta`` device from the recipe's ``recipe.shape``
(the target's ``config.json`` numbers: nothing is downloaded, no memory is used) and counts its
parameters; then it trains two optimizer steps of the recipe's drafter kind, objective and
DeepSpeed config on a tiny random model of the target's family (same ``model_type``, hidden 64),
in this one process (gloo on a CPU), on a few rows of the embedded set, through an offline
feature cache when the recipe reads one. Last it prints what the real run needs per rank.

Sizes (``e`` bytes per element: 2 for bf16, 4 for fp32; ``N`` ZeRO ranks; ``P`` trainable
parameters; ``S`` = ``data.max_length``, ``m`` = ``train.micro_batch_size``; rows taken full):

* optimizer states per rank: fp32 master weights (bf16 only) and Adam's m and v,
  ``(4 + 4 + 4) P`` bytes (``8 P`` in fp32), divided by N from ZeRO-1 on;
* drafter weights and gradients per rank: ``e P`` each, gradients / N from ZeRO-2, weights / N at ZeRO-3;
* activations per rank: ``m S`` times the bytes one row token keeps for the backward pass:
  for each of the drafter's query tokens per row token (EAGLE: ``ttt_steps``; DFlash:
  ``anchors_per_row x block_size / S``), ``e (4H + 2A + 2KV + 4I)`` per drafter layer (two norm
  inputs, the normed input, q, k, v, attention output, the MLP input and its four I-wide
  tensors) plus ``8 Vd`` for the fp32 logits and their softmax; plus the fused features
  (``e K H``) and, online, the target's fp32 logits (``4 V``) when EAGLE learns their softmax;
* target weights per rank: ``e`` times its parameters, divided over ``recipe.devices`` when
  ``target.device_map`` spreads it (one process), whole on every rank otherwise;
* FLOPs per row token: a matmul of ``W`` weights costs ``2 W`` forward and ``4 W`` backward
  (``2 W`` when its weight is frozen, as the target's lm_head a DFlash drafter reads), causal
  attention ``2 S A`` per layer forward; the target's forward is counted when features are online.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.data import DataConfig
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from draftheads.conf.schema.recipe import TargetShape
from draftheads.conf.schema.train import LoggerConfig

GIB = 2**30
# the tiny stand-in: the family's own classes at toy widths
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
# rows per embedded component, their length, and DFlash blocks per row in the tiny run
TINY_ROWS, TINY_LENGTH, TINY_ANCHORS = 8, 128, 8
KIND_NAMES = {"eagle": "EAGLE-{version}", "dflash": "DFlash (block {block_size})"}


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


# ---- the real run, on the meta device ------------------------------------------------------
def target_config(shape: TargetShape):
    """The transformers config of the real target, from the recipe's shape numbers."""
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(shape.model_type, **shape.config_dict())
    except ValueError:
        raise UserError(
            f"recipe.shape.model_type={shape.model_type} is not a transformers model type; "
            "copy model_type from the target's config.json (e.g. llama, qwen3)"
        ) from None


def meta_target(shape: TargetShape) -> nn.Module:
    """The real target's module tree on the meta device (shapes only, no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(target_config(shape))


def meta_drafter(d: DraftConfig, shape: TargetShape, name: str) -> nn.Module:
    """The recipe's drafter for the real target, on the meta device."""
    from draftheads.heads import DFlashDrafter, EagleDrafter
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
        if d.kind == "dflash":
            return DFlashDrafter(
                fp,
                target_config=config.to_dict(),
                mask_token_id=shape.vocab_size - 1 if d.mask_token_id is None else d.mask_token_id,
                block_size=d.block_size,
                num_decoder_layers=d.num_decoder_layers,
                feature_layers=d.training_layers(shape.num_hidden_layers),
                draft_vocab_size=d.draft_vocab_size,
            )
        return EagleDrafter(
            fp,
            target_config=config.to_dict(),
            version=d.version,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.feature_layers,
            draft_vocab_size=d.draft_vocab_size if d.version == 3 else None,
            fc_bias=d.fc_bias,
        )


def count(module: nn.Module | None, trainable: bool = False) -> int:
    """Parameters of ``module`` (shared tensors once), or only those that train."""
    if module is None:
        return 0
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable)


def attention_widths(config) -> tuple[int, int]:
    """(query width heads x head_dim, key/value width kv_heads x head_dim) of a layer config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return heads * head_dim, kv * head_dim


def layer_activation(config, element: int) -> int:
    """Bytes one token keeps in one drafter layer for the backward pass: e (4H + 2A + 2KV + 4I)."""
    A, KV = attention_widths(config)
    return element * (4 * config.hidden_size + 2 * A + 2 * KV + 4 * config.intermediate_size)


@dataclass(frozen=True)
class DraftCost:
    """A drafter's cost per row token: FLOPs (forward and backward) and activation bytes."""

    flops: float
    activation: float


def eagle_cost(drafter, d: DraftConfig, S: int, element: int, online: bool) -> DraftCost:
    """EAGLE: fc once per token, then ``ttt_steps`` passes of the layers and the head per token.

    flops = 6 fc + T (6 layers + 6 S A n + (6 if the head trains else 4) H Vh)
    """
    T, H = d.ttt_steps, drafter.target_fingerprint.hidden_size
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
    return DraftCost(flops, activation)


def dflash_cost(drafter, d: DraftConfig, S: int, element: int) -> DraftCost:
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
    stage = int((cfg.deepspeed.get("zero_optimization") or {}).get("stage", 0))
    sharded = cfg.target.device_map is not None
    ranks = 1 if sharded else cfg.recipe.devices
    element = 2 if t.precision == "bf16" else 4
    online, S = t.features == "online", cfg.data.max_length
    target = meta_target(shape)
    target_params = count(target)
    drafter = meta_drafter(d, shape, cfg.target.name_or_path)
    trainable = count(drafter, trainable=True)
    eagle_logits = d.kind == "eagle" and t.soft_labels != "topk"
    if d.kind == "dflash":
        cost = dflash_cost(drafter, d, S, element)
    else:
        cost = eagle_cost(drafter, d, S, element, online and eagle_logits)
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
        target_flops=target_flops(shape, target_params, S, eagle_logits) if online else 0.0,
        cache_bytes_per_token=0.0 if online else cache_bytes(cfg),
    )


def cache_bytes(cfg: Config) -> int:
    """Feature-cache bytes per token: every layer the drafter trains on, plus the top-k ids and
    logits (4 B each)."""
    f, shape = cfg.data.features, cfg.recipe.shape
    layers = cfg.draft.training_layers(shape.num_hidden_layers)
    return (4 if f.dtype == "float32" else 2) * len(layers) * shape.hidden_size + 8 * f.topk


# ---- devices -------------------------------------------------------------------------------
def devices_problem(
    name: str, devices: int, sharded: bool, world: int, gpus: int, nodes: int = 1
) -> str | None:
    """Why a run with ``world`` processes and ``gpus`` GPUs per node cannot give recipe ``name``
    its ``devices`` (one process per GPU, or, ``sharded``, one process whose target spans them)."""
    have = gpus if sharded else min(world, gpus * nodes)
    if devices <= have:
        return None
    if sharded:
        fix = f"run it where {devices} GPUs are visible"
    else:
        fix = f"launch one process per GPU: torchrun --nproc_per_node={devices} --no-python draftheads train recipe={name}"
    where = f"{gpus} GPU(s) visible" if sharded else f"{world} process(es) over {gpus * nodes} GPU(s)"
    return (
        f"recipe={name} needs {devices} GPUs (recipe.devices) and this run has {where}; {fix}, "
        "or size it here with train.dry_run=true"
    )


def check_devices(cfg: Config) -> None:
    """Refuse, before anything loads, a recipe asking for more GPUs than this run has."""
    r = cfg.recipe
    if r.name is None:
        return
    world = int(os.environ.get("WORLD_SIZE", 1))
    nodes = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    gpus = torch.cuda.device_count()
    problem = devices_problem(r.name, r.devices, cfg.target.device_map is not None, world, gpus, nodes)
    if problem:
        raise UserError(problem)


# ---- the tiny run ----------------------------------------------------------------------------
def tiny_layers(d: DraftConfig) -> tuple[int, list[int] | None]:
    """(layers of the tiny target, the drafter's feature layers on it): the recipe's number of
    feature layers, as the first ones, and at least 4 layers (EAGLE-3's three distinct ones; the
    spread rule needs depth + 3)."""
    if not d.feature_layers:
        return (
            max(4, d.num_decoder_layers + 3) if d.kind == "dflash" and d.feature_rule == "spread" else 4
        ), None
    k = len(d.feature_layers)
    return max(4, k + 1), list(range(1, k + 1))


def save_tiny_target(shape: TargetShape, layers: int, out: Path, seed: int) -> None:
    """A random-init model of the recipe's family at toy widths, with the embedded tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftheads.heads.target import load_tokenizer

    tok = load_tokenizer(TargetConfig(name_or_path="smollm2"))
    special = {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    config = AutoConfig.for_model(
        shape.model_type,
        num_hidden_layers=layers,
        vocab_size=len(tok),
        tie_word_embeddings=False,
        **TINY,
        **special,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def tiny_config(cfg: Config, tmp: Path) -> Config:
    """The recipe's config with a tiny target, a few embedded rows and two steps into ``tmp``."""
    layers, feature_layers = tiny_layers(cfg.draft)
    save_tiny_target(cfg.recipe.shape, layers, tmp / "target", cfg.train.seed)
    target = TargetConfig(
        name_or_path=str(tmp / "target"),
        dtype=cfg.target.dtype,
        attn_implementation=cfg.target.attn_implementation,
        device_map=cfg.target.device_map if isinstance(cfg.target.device_map, str) else None,
    )
    draft = dataclasses.replace(
        cfg.draft,
        feature_layers=feature_layers,
        mask_token_id=None,
        anchors_per_row=min(cfg.draft.anchors_per_row, TINY_ANCHORS),
    )
    features = dataclasses.replace(cfg.data.features, out_dir=str(tmp / "features"))
    data = DataConfig(path="embedded", max_length=TINY_LENGTH, max_rows=TINY_ROWS, features=features)
    train = dataclasses.replace(
        cfg.train,
        output_dir=str(tmp / "train"),
        max_steps=2,
        epochs=None,
        stop_at=None,
        warmup_steps=0,
        eval_every=2,
        eval_rows=2,
        save_every=0,
        log_every=1,
        resume="none",
        rows=None,
        progress=False,
        dry_run=False,
        feature_cache=str(tmp / "features") if cfg.train.features == "offline" else None,
    )
    return Config(
        target=target, draft=draft, data=data, train=train, deepspeed=cfg.deepspeed, logger=LoggerConfig()
    )


def build_tiny_cache(cfg: Config) -> None:
    """The offline feature cache of the tiny run, as ``draftheads features`` writes it."""
    from draftheads.data.cache_build import build_feature_cache
    from draftheads.data.prepare import prepare_dataset
    from draftheads.heads.target import load_target
    from draftheads.heads.target_layers import decoder_layers

    f = cfg.data.features
    model, tok = load_target(cfg.target)
    ds, _ = prepare_dataset(cfg.data, tok, "train")
    layers = cfg.draft.training_layers(len(decoder_layers(model)))
    build_feature_cache(
        model, tok, ds, f.out_dir, layers, dtype=f.dtype, batch_tokens=f.batch_tokens,
        target_next=f.target_next, topk=f.topk, shard_mb=f.shard_mb, show_progress=False,
    )  # fmt: skip


def tiny_losses(cfg: Config, train: Callable[[Config], Any]) -> list[float]:
    """Train the tiny stand-in (through its feature cache when the recipe is offline); the losses."""
    from draftheads.train.metrics import read_metrics

    if cfg.train.features == "offline":
        build_tiny_cache(cfg)
    out = train(cfg)
    return [float(row["loss"]) for row in read_metrics(out) if "loss" in row]


# ---- the report ------------------------------------------------------------------------------
def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def report(cfg: Config, needs: Needs, losses: list[float], tiny: Config) -> str:
    """The printed summary: the tiny run, then the real run's needs, one figure a line."""
    shape, t, d = cfg.recipe.shape, cfg.train, cfg.draft
    stage = int((cfg.deepspeed.get("zero_optimization") or {}).get("stage", 0))
    kind = KIND_NAMES[d.kind].format(version=d.version, block_size=d.block_size)
    sharded = cfg.target.device_map is not None
    placement = (
        f"one process, the target over {cfg.recipe.devices} GPUs (target.device_map={cfg.target.device_map})"
        if sharded
        else f"{needs.ranks} ranks, one GPU each"
    )
    states = "fp32 master + Adam m, v: 12 B" if t.precision == "bf16" else "Adam m, v: 8 B"
    shard = f" / {needs.ranks} ranks" if stage >= 1 and needs.ranks > 1 else ""
    e = "2 B" if t.precision == "bf16" else "4 B"
    where = "whole on every rank" if not sharded else f"over {cfg.recipe.devices} GPUs"
    per_rank = needs.optimizer_bytes + needs.weights_grads_bytes + needs.activation_bytes + needs.target_bytes
    lines = [
        f"dry run of recipe {cfg.recipe.name or '(recipe.shape)'}: {kind}, {t.features} features, "
        f"ZeRO-{stage}, {t.precision}",
        f"  2 optimizer steps on a tiny {shape.model_type} ({tiny_layers(d)[0]} layers, hidden "
        f"{TINY['hidden_size']}, embedded rows of <= {tiny.data.max_length} tokens): "
        f"loss {' -> '.join(f'{v:.4f}' for v in losses)}",
        f"real run: {cfg.target.name_or_path} ({shape.model_type}, {shape.num_hidden_layers} layers, hidden "
        f"{shape.hidden_size}, vocab {shape.vocab_size}); {placement}; micro-batch {t.micro_batch_size} x "
        f"{cfg.data.max_length} tokens, grad_accum {t.grad_accum}",
        f"  target parameters          {needs.target_params:,}",
        f"  drafter parameters         {needs.drafter_params:,}",
        f"  trainable parameters       {needs.trainable_params:,}",
        f"  optimizer states per rank  {gib(needs.optimizer_bytes)}  ({states} x trainable{shard}, ZeRO-{stage}"
        + (", offloaded to CPU memory)" if offloaded(cfg.deepspeed) else ")"),
        f"  weights + grads per rank   {gib(needs.weights_grads_bytes)}  ({e} x trainable each"
        + (f"; grads / {needs.ranks}" if stage >= 2 and needs.ranks > 1 else "")
        + (f"; weights / {needs.ranks}" if stage >= 3 and needs.ranks > 1 else "")
        + ")",
        f"  activations per rank       {gib(needs.activation_bytes)}  (micro-batch x max_length x "
        f"{needs.activation_bytes / (t.micro_batch_size * cfg.data.max_length) / 1024:.0f} KiB per row token)",
        f"  target weights per rank    {gib(needs.target_bytes)}  ({cfg.target.dtype}, {where})",
        f"  total per rank             {gib(per_rank)}",
        f"  FLOPs per token            {needs.flops_per_token / 1e9:.2f} GFLOP  (drafter forward+backward "
        f"{needs.drafter_flops / 1e9:.2f} + target forward {needs.target_flops / 1e9:.2f})",
    ]
    if needs.cache_bytes_per_token:
        lines.append(
            f"  feature cache on disk      {needs.cache_bytes_per_token / 1024:.1f} KiB per token "
            f"(build it first: draftheads features recipe={cfg.recipe.name})"
        )
    return "\n".join(lines)


def offloaded(ds: dict) -> bool:
    """Whether the DeepSpeed config keeps the optimizer states in CPU memory."""
    offload = (ds.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return offload.get("device") == "cpu"


def run(cfg: Config, train: Callable[[Config], Any]) -> None:
    """The dry run of ``cfg``'s recipe: size the real run, train the tiny stand-in with ``train``
    (the recipe's own entry point), print both."""
    if not cfg.recipe.shape.given:
        raise UserError(
            "train.dry_run=true sizes a real run from recipe.shape, and none is set; pick a recipe "
            "(recipe=llama3.1-8b-eagle3, see conf/recipe/) or give recipe.shape.* from the target's config.json"
        )
    if cfg.draft.kind not in KIND_NAMES:
        raise UserError(
            f"train.dry_run=true sizes EAGLE and DFlash drafters, not draft.kind={cfg.draft.kind}; "
            "use draft=eagle3 or draft=dflash"
        )
    needs = real_needs(cfg)  # the real drafter is built first: a recipe that cannot build stops here
    with tempfile.TemporaryDirectory(prefix="draftheads-dry-run-") as tmp:
        tiny = tiny_config(cfg, Path(tmp))
        losses = tiny_losses(tiny, train)
    print(report(cfg, needs, losses, tiny))
