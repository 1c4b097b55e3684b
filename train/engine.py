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
import os
import socket
from functools import partial
from typing import Any
from unittest import mock

import torch

from draftheads.conf.schema.train import TrainConfig
from draftheads.train.objectives import lr_factor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_op_left_out() -> contextlib.AbstractContextManager:
    """Where DeepSpeed's CPU backend starts: without its shared-memory all-reduce op. DeepSpeed
    builds that C++ op (about 40 s on 2 cores, once per environment) when a process group starts,
    but only its tensor-parallel inference layers call it (``inference_all_reduce``); data-parallel
    training reduces through ``torch.distributed`` (gloo) whether the op is there or not, so no
    run of draftheads, single- or multi-process, pays for the build."""
    # by its module path: ``deepspeed.comm``'s attribute ``torch`` is torch itself
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    if torch.cuda.is_available() or not hasattr(ds_torch, "build_shm_op"):
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

        with shm_op_left_out():
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
    """The deepspeed group plus what the recipe derives from ``train.*``.

    The optimizer is always torch's AdamW over the trainable groups (:func:`build_engine`), with
    ZeRO-Offload too: DeepSpeed otherwise refuses a client optimizer when the optimizer state is
    offloaded, asking for its own CPU Adam, a C++ op it builds at first use (about 30 s on 2
    cores). The offloaded state steps on the CPU with the same AdamW math as in memory."""
    return {
        "zero_force_ds_cpu_optimizer": False,
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
