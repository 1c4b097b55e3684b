"""Typed configs of the training recipe (Hydra groups ``train/`` and ``logger/``) and their checks.

OmegaConf already rejects unknown keys and wrong types while composing. :func:`validate`
adds the value checks (ranges, choices, combinations) so that a bad run fails before the
target is loaded, with one line that names the key and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.checks import finite
from draftheads.conf.schema.kinds import DRAFT_KINDS, draft_kind

LR_SCHEDULES = ("cosine", "linear", "constant")
PRECISIONS = ("fp32", "bf16")
SOFT_LABELS = ("auto", "full", "topk")
LOGGER_KINDS = ("none", "wandb")
LOGGER_MODES = ("auto", "online", "offline", "disabled")
# Keys of the deepspeed group that the recipe derives from train.*; setting them twice is a mistake.
DERIVED_DS_KEYS = {
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "train_batch_size": "train.micro_batch_size and train.grad_accum",
    "gradient_accumulation_steps": "train.grad_accum",
    "gradient_clipping": "train.grad_clip",
    "optimizer": "train.lr / train.weight_decay / train.betas",
    "scheduler": "train.lr_schedule / train.warmup_steps / train.warmup_ratio",
    "fp16": "train.precision",
    "bf16": "train.precision",
}


@dataclass
class TrainConfig:
    """Optimisation, schedule, checkpointing and evaluation of one training run."""

    output_dir: str = "outputs/train"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    # warm-up as a share of the run's optimizer steps (z-lab's reference recipe: 0.04); the
    # longer of this and warmup_steps applies
    warmup_ratio: float = 0.0
    # Optimizer steps. With ``epochs`` set, max_steps is derived from the data size instead.
    max_steps: int = 200
    epochs: float | None = None
    micro_batch_size: int = 4
    grad_accum: int = 1
    grad_clip: float = 1.0
    precision: str = "fp32"
    eval_every: int = 50
    eval_rows: int = 16
    topk: int = 5
    save_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    # auto: resume from the newest intact checkpoint if there is one (so rerunning an
    # interrupted command continues it); none: start fresh (refuses a directory that holds
    # checkpoints); or a path to one checkpoint directory.
    resume: str = "auto"
    # Stop after this many steps as if interrupted (the schedule still spans max_steps):
    # time-boxed or preemptible jobs, resumed later with train.resume=auto.
    stop_at: int | None = None
    # online: run the target every step; offline: read data.FeatureCache at feature_cache.
    features: str = "online"
    feature_cache: str | None = None
    # a drafter's token loss against the target's distribution: full (project the cached final
    # state through the whole vocabulary), topk (the feature cache's top-k logits, for a drafter
    # that learns from them), or auto (topk when the cache holds them and the drafter learns from
    # them, else full; a drafter that does not read the final state learns the data's next tokens
    # without them).
    soft_labels: str = "auto"
    # Rows that carry cached features go end to end into one row per micro-batch (per-row
    # positions and attention), so no step computes on padding; the loss is the padded one's.
    pack_micro_batches: bool = True
    # A datasets.save_to_disk directory of pre-tokenized rows (input_ids, loss_mask); skips data.*.
    rows: str | None = None
    progress: bool = True
    # Build everything and run two steps on a tiny model of the recipe's family, then print what
    # the real run needs (parameters, memory per rank, FLOPs per token; see train/dry_run/sizing.py).
    dry_run: bool = False


@dataclass
class LoggerConfig:
    """Where metrics go besides ``output_dir/metrics.jsonl``: wandb or nowhere."""

    kind: str = "none"
    project: str = "draftheads"
    name: str | None = None
    # auto: online when an API key is configured, else offline (WANDB_MODE, if set, wins).
    mode: str = "auto"
    dir: str | None = None


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise UserError(f"{key}={value!r} is not valid; use one of {', '.join(options)}")


def _at_least(key: str, value: float | int | None, low: float, hint: str = "") -> None:
    if value is not None and value < low:
        raise UserError(f"{key}={value} must be >= {low}{'; ' + hint if hint else ''}")


def validate_train(t: TrainConfig) -> None:
    if not str(t.output_dir or "").strip():
        raise UserError(
            "train.out_dir is empty (it would train into the working directory); "
            "give the run's folder, e.g. train.out_dir=outputs/train"
        )
    if not t.lr > 0:
        raise UserError(f"train.lr={t.lr} must be > 0 (e.g. train.lr=1e-3)")
    _at_least("train.weight_decay", t.weight_decay, 0)
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise UserError(f"train.betas={list(t.betas)} must be two numbers in [0, 1), e.g. [0.9,0.95]")
    _choice("train.lr_schedule", t.lr_schedule, LR_SCHEDULES)
    _choice("train.precision", t.precision, PRECISIONS)
    _at_least("train.max_steps", t.max_steps, 1)
    if t.epochs is not None and not t.epochs > 0:
        raise UserError(f"train.epochs={t.epochs} must be > 0, or null to use train.max_steps")
    _at_least("train.warmup_steps", t.warmup_steps, 0)
    if not 0 <= t.warmup_ratio < 1:
        raise UserError(
            f"train.warmup_ratio={t.warmup_ratio} must be in [0, 1), e.g. 0.04 for 4% of the steps"
        )
    for key in ("micro_batch_size", "grad_accum", "log_every", "topk", "eval_rows"):
        _at_least(f"train.{key}", getattr(t, key), 1)
    for key in ("eval_every", "save_every", "grad_clip", "keep_checkpoints"):
        _at_least(f"train.{key}", getattr(t, key), 0, "0 turns it off")
    _at_least("train.stop_at", t.stop_at, 1)
    _choice("train.features", t.features, ("online", "offline"))
    _choice("train.soft_labels", t.soft_labels, SOFT_LABELS)
    if t.soft_labels == "topk" and t.features != "offline":
        raise UserError(
            "train.soft_labels=topk reads a feature cache's top-k logits; set train.features=offline "
            "and train.feature_cache=DIR (built with data.features.topk=64), or use train.soft_labels=full"
        )
    if t.feature_cache and t.features != "offline":
        raise UserError(
            f"train.feature_cache={t.feature_cache} is read only with train.features=offline (online "
            "training runs the target on data.path); add train.features=offline, or drop train.feature_cache"
        )
    if t.features == "offline" and not t.feature_cache:
        raise UserError("train.features=offline needs train.feature_cache=DIR (a feature cache directory)")
    if t.resume not in ("none", "auto") and not Path(t.resume).is_dir():
        raise UserError(f"train.resume={t.resume!r}: use none, auto, or an existing checkpoint directory")
    if t.rows and not Path(t.rows).is_dir():
        raise UserError(f"train.rows={t.rows}: no such directory (a datasets.save_to_disk folder)")


def validate_logger(lg: LoggerConfig) -> None:
    _choice("logger.kind", lg.kind, LOGGER_KINDS)
    _choice("logger.mode", lg.mode, LOGGER_MODES)


def validate_draft(d, num_target_layers: int | None = None) -> None:
    """Value checks of ``draft.*`` that reading the config does not already make (its kind's own
    checks run when a ``DraftConfig`` is built)."""
    _choice("draft.kind", d.kind, tuple(DRAFT_KINDS))


def validate_deepspeed(ds: dict[str, Any]) -> None:
    for key, owner in DERIVED_DS_KEYS.items():
        if key in ds:
            raise UserError(f"deepspeed.{key} is derived from {owner}; set that instead")
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UserError(f"deepspeed.zero_optimization.stage={stage} is not valid; use 0, 1, 2 or 3")


def validate(cfg) -> None:
    """Every value check of a training run; raises :class:`UserError` naming the key."""
    finite(cfg)
    validate_train(cfg.train)
    validate_logger(cfg.logger)
    validate_draft(cfg.draft)
    validate_deepspeed(cfg.deepspeed)
    problem = draft_kind(cfg.draft.kind).train_problem(cfg.draft, cfg.train)
    if problem:
        raise UserError(problem)
