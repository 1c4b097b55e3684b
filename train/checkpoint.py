"""Atomic training checkpoints under ``output_dir/checkpoints/step-NNNNNNN``.

A checkpoint is DeepSpeed's own (module, optimizer, scheduler, engine counters; frozen
parameters excluded) plus each rank's RNG state and the drafter as a loadable
``config.json`` + ``model.safetensors``. Every rank writes into
``checkpoints/.partial-step-N/``; after a barrier rank 0 renames the finished folder to
``step-N`` (one atomic rename) and only then updates ``latest``. A run killed mid-write
leaves a ``.partial-*`` folder that nothing ever loads, and that the next start removes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

PREFIX = "step-"


def step_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first (partial writes never carry the ``step-`` name)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def remove_partials(root: Path) -> None:
    if root.is_dir():
        for p in root.glob(".partial-*"):
            shutil.rmtree(p, ignore_errors=True)


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])


def save(engine, root: Path, step: int, rank: int, export_drafter) -> Path:
    """Write checkpoint ``step`` atomically; ``export_drafter(dir)`` writes the loadable drafter."""
    name = step_name(step)
    partial = root / f".partial-{name}"
    engine.save_checkpoint(
        str(partial), tag=name, client_state={"step": step}, save_latest=False, exclude_frozen_parameters=True
    )
    (partial / name).mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), partial / name / f"rng-rank{rank}.pt")
    export_drafter(partial / name / "drafter")  # collective under ZeRO-3; rank 0 writes
    dist.barrier()
    final = root / name
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial / name, final)
        shutil.rmtree(partial, ignore_errors=True)
        tmp = root / f".latest.tmp{os.getpid()}"
        tmp.write_text(name + "\n")
        os.replace(tmp, root / "latest")
    dist.barrier()
    return final


def prune(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (0 keeps all)."""
    if keep > 0:
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def load(engine, ckpt: Path, rank: int) -> int:
    """Restore engine, optimizer, scheduler and this rank's RNG; returns the step to continue from."""
    _, client = engine.load_checkpoint(
        str(ckpt.parent),
        tag=ckpt.name,
        load_module_strict=False,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
    )
    if client is None:
        from draftheads.conf.errors import UserError

        raise UserError(f"{ckpt} is not a readable training checkpoint; remove it or pass train.resume=none")
    rng = ckpt / f"rng-rank{rank}.pt"
    if rng.is_file():
        set_rng_state(torch.load(rng, weights_only=False))
    return int(client["step"])


# What a resumed run must share with the run that wrote the checkpoint for its steps to continue
# that run: everything that shapes the drafter, the data, their order and the optimizer. Keys not
# listed (output and logging cadence, stop_at, max_steps to extend a run) may change.
RESUME_SECTIONS = ("target", "draft", "data", "deepspeed")
RESUME_TRAIN_KEYS = (
    "lr", "weight_decay", "betas", "lr_schedule", "warmup_steps", "micro_batch_size", "grad_accum",
    "grad_clip", "precision", "seed", "features", "feature_cache", "rows", "eval_rows",
)  # fmt: skip
# where the target runs, and data settings that only other commands read
RESUME_FREE_KEYS = ("target.device", "target.cache_dir", "data.distill.", "data.features.", "data.show")


def config_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first config key (dotted) whose value differs between a checkpoint's run and this one."""

    def flat(d: Any, prefix: str) -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix: d}
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}"))
        return out or {prefix: d}

    keys = [*RESUME_SECTIONS, *(f"train.{k}" for k in RESUME_TRAIN_KEYS)]
    a, b = {}, {}
    for key in keys:
        section, _, sub = key.partition(".")
        a.update(flat(saved.get(section, {}).get(sub) if sub else saved.get(section), key))
        b.update(flat(current.get(section, {}).get(sub) if sub else current.get(section), key))
    for key in sorted(set(a) | set(b)):
        if key.startswith(RESUME_FREE_KEYS):
            continue
        if a.get(key) != b.get(key):
            return f"{key}={a.get(key)!r} in the checkpoint, {b.get(key)!r} now"
    return None


def saved_config(ckpt: Path) -> dict[str, Any] | None:
    """The run config recorded in a checkpoint's drafter (``provenance.config``), if readable."""
    try:
        meta = json.loads((ckpt / "drafter" / "config.json").read_text())
        return meta["provenance"]["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
