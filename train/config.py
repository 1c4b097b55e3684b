"""Typed configs of the training recipe (Hydra groups ``train/`` and ``logger/``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    output_dir: str = "outputs/train"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    max_steps: int = 200
    epochs: int | None = None
    micro_batch_size: int = 4
    grad_accum: int = 1
    grad_clip: float = 1.0
    eval_every: int = 50
    save_every: int = 100
    log_every: int = 10
    seed: int = 0
    resume: str = "none"
    features: str = "online"
    feature_cache: str | None = None


@dataclass
class LoggerConfig:
    kind: str = "none"
    project: str = "draftheads"
    name: str | None = None
    mode: str = "offline"
