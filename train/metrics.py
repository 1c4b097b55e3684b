"""Metrics: exact aggregation over micro-batches and ranks, and where they are written.

Objectives return sums and counts (``head0/loss_sum``, ``head0/n``, ``head0/top1``...).
:class:`Window` adds them up between two log points and all-reduces once, so every ratio
is over all the tokens of the window. :class:`MetricSink` writes ``metrics.jsonl`` (always,
rank 0) and wandb (``logger=wandb``; offline when no API key is configured); one run at a time,
under the output folder's lock (:mod:`draftheads.data.outdir`).
"""

from __future__ import annotations

import json
import netrc
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from draftheads.conf.errors import UserError
from draftheads.conf.schema.train import LoggerConfig
from draftheads.data.outdir import release_out_dir


class Window:
    """Sums of statistics since the last :meth:`reduce`.

    ``group/x_sum`` is divided by ``group/x_n`` when the objective gives one (a loss over other
    rows than the group's), else by ``group/n``.
    """

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        for k, v in stats.items():
            v = v.detach().double().cpu()
            self.sums[k] = self.sums[k] + v if k in self.sums else v

    def reduce(self) -> dict[str, float]:
        """All-reduce (sum) and turn ``x_sum``/``n`` pairs into means and accuracies."""
        keys = sorted(self.sums)
        if dist.is_initialized() and dist.get_world_size() > 1 and keys:
            flat = torch.stack([self.sums[k] for k in keys])
            dist.all_reduce(flat)
            self.sums = dict(zip(keys, flat))
        out: dict[str, float] = {}
        for k in keys:
            group, name = k.rsplit("/", 1)
            if name == "n" or name.endswith("_n"):
                continue
            metric = name[: -len("_sum")] if name.endswith("_sum") else f"acc_{name}"
            count = self.sums.get(f"{group}/{metric}_n", self.sums.get(f"{group}/n", torch.tensor(0.0)))
            n = float(count)
            out[f"{group}/{metric}"] = float(self.sums[k]) / n if n else float("nan")
        self.sums = {}
        return out


def wandb_mode(cfg: LoggerConfig) -> str:
    """auto: WANDB_MODE if set, else online with an API key, else offline."""
    if cfg.mode != "auto":
        return cfg.mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


class MetricSink:
    """``metrics.jsonl`` plus wandb; everything is a no-op off rank 0."""

    def __init__(self, output_dir: Path, cfg: LoggerConfig, config: dict[str, Any], rank: int) -> None:
        self.rank = rank
        self.path = output_dir / "metrics.jsonl"
        self.run = None
        if rank != 0:
            return
        if cfg.kind == "wandb":
            import wandb

            self.run = wandb.init(
                project=cfg.project,
                name=cfg.name,
                mode=wandb_mode(cfg),
                dir=cfg.dir or str(output_dir),
                config=config,
                resume="allow",
                id=_run_id(output_dir),
            )

    def truncate_after(self, step: int) -> None:
        """Drop rows logged after ``step`` (a resumed run logs them again)."""
        if self.rank == 0 and self.path.is_file():
            keep = [r for r in read_metrics(self.path.parent) if r["step"] <= step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.rank != 0:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def close(self) -> None:
        """Finish wandb and release the output folder's lock (taken by ``check_output_dir``):
        the metrics are the last thing a run writes there."""
        if self.run is not None:
            self.run.finish()
            self.run = None
        if self.rank == 0:
            release_out_dir(self.path.parent)


def _run_id(output_dir: Path) -> str:
    """One wandb run per output directory, so a resumed run continues its curves."""
    f = output_dir / ".wandb_run_id"
    if not f.is_file():
        import uuid

        f.write_text(uuid.uuid4().hex[:12])
    return f.read_text().strip()


def read_metrics(output_dir: str | os.PathLike) -> list[dict]:
    """The rows of ``metrics.jsonl``; a torn last line (a run killed mid-write) is skipped."""
    path = Path(output_dir) / "metrics.jsonl"
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise UserError(f"{path} line {i + 1} is corrupt; delete that line and rerun") from None
    return rows
