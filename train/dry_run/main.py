"""``train.dry_run=true``: try a recipe on any machine, and size its real run.

The dry run first sizes the real run from the recipe's ``recipe.shape``, building its drafter on
the ``meta`` device (:mod:`draftheads.train.dry_run.sizing`: a recipe that cannot build stops there);
then it trains two optimizer steps of a tiny stand-in of the target's family
(:mod:`draftheads.train.dry_run.tiny_run`); last it prints both, what the real run needs per rank one
figure a line.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.kinds import depth_problem, draft_kind
from draftheads.heads import drafter_kind
from draftheads.train.dry_run.sizing import Needs, real_needs
from draftheads.train.dry_run.tiny_run import TINY, tiny_config, tiny_layers, tiny_losses
from draftheads.train.engine import zero_stage
from draftheads.train.modules.costs import sized_kinds

GIB = 2**30


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def report(cfg: Config, needs: Needs, losses: list[float], tiny: Config) -> str:
    """The printed summary: the tiny run, then the real run's needs, one figure a line."""
    shape, t, d = cfg.recipe.shape, cfg.train, cfg.draft
    stage = zero_stage(cfg.deepspeed)
    kind = drafter_kind(d.kind).title.format(**dataclasses.asdict(d.section))
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
    serving = draft_kind(d.kind).serving_note(d)
    if serving:
        lines.append(f"  serving                    {serving}")
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
            "(recipe=NAME, one of conf/recipe/) or give recipe.shape.* from the target's config.json"
        )
    sized = sized_kinds()  # the kinds whose record names a training cost
    if cfg.draft.kind not in sized:
        raise UserError(
            f"train.dry_run=true sizes {', '.join(sized)} drafters, not draft.kind={cfg.draft.kind}; "
            f"use {' or '.join(draft_kind(k).options for k in sized)}"
        )
    problem = depth_problem(cfg.draft, cfg.recipe.shape.num_hidden_layers)
    if problem:
        raise UserError(problem)
    needs = real_needs(cfg)  # the real drafter is built first: a recipe that cannot build stops here
    with tempfile.TemporaryDirectory(prefix="draftheads-dry-run-") as tmp:
        tiny = tiny_config(cfg, Path(tmp))
        losses = tiny_losses(tiny, train)
    print(report(cfg, needs, losses, tiny))
