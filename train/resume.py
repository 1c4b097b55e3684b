"""Which checkpoint a run continues from (``train.resume``), and whether it may.

``auto`` (the default) continues from the newest intact checkpoint under ``checkpoints/``, if
any; a path continues from that checkpoint, refused when it is damaged; ``none`` starts fresh,
refused when the folder already holds checkpoints. Every checkpoint a run continues from must
have been written by an identically configured run, or its steps would not continue this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.train import checkpoint


def resume_point(resume: str, root: Path, out: Path, current: dict[str, Any]) -> Path | None:
    """The checkpoint under ``root`` (``out/checkpoints``) that ``train.resume=resume`` continues
    from, checked against the run config ``current``; None for a fresh run."""
    if resume != "none":
        ckpt = checkpoint.intact_checkpoint(root) if resume == "auto" else Path(resume)
        why = checkpoint.damage(ckpt) if ckpt is not None and resume != "auto" else None
        if why is not None:
            raise UserError(f"train.resume={ckpt} is damaged ({why}); pick another checkpoint")
        if ckpt is not None:
            check_resumable(ckpt, current)
        return ckpt
    latest = checkpoint.latest_checkpoint(root)
    if latest is not None:
        raise UserError(
            f"train.out_dir={out} already holds checkpoints (latest {latest.name}); "
            "pass train.resume=auto to continue it, or pick another train.out_dir"
        )
    return None


def check_resumable(ckpt: Path, current: dict[str, Any]) -> None:
    """Refuse a checkpoint written by a differently configured run: its steps would not continue
    this one (another drafter shape, data, order or optimizer)."""
    saved = checkpoint.saved_config(ckpt)
    if saved is None:
        raise UserError(
            f"{ckpt} has no readable drafter/config.json, so its run config is unknown; "
            "pick another checkpoint or pass train.resume=none with a new train.out_dir"
        )
    diff = checkpoint.config_mismatch(saved, current)
    if diff is not None:
        raise UserError(
            f"cannot resume from {ckpt}: {diff}; rerun with the checkpoint's value, "
            "or start fresh in another train.out_dir"
        )
