"""Whether this run has the GPUs a recipe asks for (``recipe.devices``), checked before anything loads.

A recipe's real run takes one process per GPU, or, when ``target.device_map`` spreads the
target, one process that sees them all; a run launched with fewer is refused in one line that
says how to launch it (or to size it with ``train.dry_run=true``).
"""

from __future__ import annotations

import os

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config


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
