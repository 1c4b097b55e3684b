"""The DeepSpeed engine: process group, config and ``deepspeed.initialize`` for every mode, and
ZeRO-3's gathering of partitioned parameters where a weight must be read or written whole.

One code path from a single CPU process to multi-node: torchrun (or ``deepspeed
--no_local_rank``) sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*; a plain ``python`` process gets
single-process defaults here, so DeepSpeed does not go looking for MPI. On a machine without
CUDA, DeepSpeed runs on its CPU accelerator over gloo.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import os
import socket
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from draftheads.conf.schema.train import TrainConfig
from draftheads.train.objectives import lr_factor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# DeepSpeed compiles its CPU all-reduce op once (about 40 s on 2 cores) under a lock file; a build
# interrupted there leaves the lock, and torch then waits on it forever, silently
SHM_OP = "deepspeed_shm_comm"
STALE_LOCK_S = 600.0


def clear_stale_build_lock(name: str = SHM_OP, stale_s: float = STALE_LOCK_S) -> Path | None:
    """Remove the op build's lock file when it is older than any build takes (an interrupted
    build's), saying so in one line; returns the path removed, or None."""
    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return None
    if age < stale_s:
        return None
    lock.unlink(missing_ok=True)
    print(
        f"note: removed {lock}, left {age / 60:.0f} min ago by an interrupted build of DeepSpeed's {name} op; "
        "building it again",
        file=sys.stderr,
    )
    return lock


def shm_op_left_out(single: bool) -> contextlib.AbstractContextManager:
    """Where DeepSpeed's CPU backend starts: for a single process (``single``), without its
    shared-memory all-reduce op, which only reduces across ranks on one machine and costs a 40 s
    build where it was never built (``make demo`` and ``make bench`` train in one process);
    processes of a multi-process run load it as DeepSpeed does."""
    # by its module path: ``deepspeed.comm``'s attribute ``torch`` is torch itself
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    if not single or torch.cuda.is_available() or not hasattr(ds_torch, "build_shm_op"):
        return contextlib.nullcontext()
    return mock.patch.object(ds_torch, "build_shm_op", lambda: None)


def init_distributed() -> tuple[int, int]:
    """Initialise (once) the default process group; returns (rank, world size)."""
    import torch.distributed as dist

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:  # a single process started without a launcher
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if not dist.is_initialized():
        import deepspeed

        single = int(os.environ.get("WORLD_SIZE", "1")) == 1
        if not torch.cuda.is_available() and not single:
            clear_stale_build_lock()
        # DeepSpeed prints "... op built successfully" on stdout each time it loads the CPU op,
        # even from the copy `make shm-op` built: a run's output would read as a 40 s build
        with contextlib.redirect_stdout(io.StringIO()), shm_op_left_out(single):
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(close_distributed)
    return dist.get_rank(), dist.get_world_size()


def close_distributed() -> None:
    """Destroy the default process group (registered at exit by :func:`init_distributed`).

    A rank that leaves its group standing can hang in the interpreter's finalisation after its
    work is done (seen with gloo on DeepSpeed's CPU accelerator under torchrun), so every process
    that created the group tears it down before it exits.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def device_for_rank() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def deepspeed_config(ds: dict[str, Any], train: TrainConfig) -> dict[str, Any]:
    """The deepspeed group plus what the recipe derives from ``train.*``."""
    return {
        **ds,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "gradient_clipping": train.grad_clip,
        "bf16": {"enabled": train.precision == "bf16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def zero_stage(ds: dict[str, Any]) -> int:
    return int((ds.get("zero_optimization") or {}).get("stage", 0))


def gathered(params: list[torch.nn.Parameter], stage: int) -> contextlib.AbstractContextManager:
    """Under ZeRO-3, make partitioned parameters whole for the duration of the block."""
    if stage == 3 and any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=0)
    return contextlib.nullcontext()


def build_engine(module: torch.nn.Module, ds: dict[str, Any], train: TrainConfig, total_steps: int):
    """``deepspeed.initialize`` with AdamW over the module's trainable parameter groups only,
    and a warm-up + decay schedule stepped once per optimizer step."""
    import deepspeed

    groups = [g for g in module.param_groups(train.lr) if g["params"]]
    optimizer = torch.optim.AdamW(
        groups, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay
    )
    warmup = max(train.warmup_steps, round(train.warmup_ratio * total_steps))
    schedule = partial(lr_factor, train.lr_schedule, warmup=warmup, total=total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=deepspeed_config(ds, train),
    )
    return engine
