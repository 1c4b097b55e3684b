"""Checks a command runs on its inputs before any work starts, so a mistake costs nothing.

Each raises :class:`UserError` with one line naming the key and the fix, and none of them
changes anything on disk.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from draftheads.conf.errors import UserError

CHECKPOINT_FILES = ("config.json", "model.safetensors", "metrics.jsonl")


def nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def writable_dir(path: str | os.PathLike, key: str) -> Path:
    """Refuse an output directory that is a file or cannot be created or written; returns it.

    Probed by creating (and removing) a temporary directory in the closest existing ancestor,
    so the answer is the file system's own, also for root and for pseudo file systems.
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"{key}={path} is an existing file, not a directory; choose a directory path")
    base = nearest_existing(out)
    if not base.is_dir():
        raise UserError(
            f"{key}={path}: {base} is a file, so the directory cannot be created; choose another path"
        )
    try:
        tempfile.TemporaryDirectory(dir=base, prefix=".draftheads-probe-").cleanup()
    except OSError as e:
        raise UserError(
            f"{key}={path} cannot be written ({e.strerror or e}); choose a writable directory"
        ) from None
    return out


def writable_file(path: str | os.PathLike, key: str) -> Path:
    """Refuse an output file whose folder cannot be written, or that is an existing directory."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise UserError(f"{key}={path} is a directory; give a file path")
    writable_dir(out.parent, key)
    return out


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a drafter checkpoint or a training run."""
    return path.is_dir() and any((path / name).exists() for name in CHECKPOINT_FILES)


def not_a_checkpoint(path: str | os.PathLike, key: str) -> Path:
    """Refuse to write into a directory that holds a checkpoint or a training run."""
    out = writable_dir(path, key)
    if is_checkpoint(out):
        raise UserError(f"{key}={path} holds a drafter checkpoint or training run; choose a new directory")
    return out


def prompt_fits(n_prompt: int, max_new_tokens: int, context: int | None) -> str | None:
    """Refuse a prompt longer than the target's context; a warning if the answer would overflow it."""
    if not context:
        return None
    if n_prompt >= context:
        raise UserError(
            f"the prompt is {n_prompt} tokens, the target's context is {context}; shorten the prompt"
        )
    if n_prompt + max_new_tokens > context:
        return (
            f"warning: prompt ({n_prompt} tokens) + decode.max_new_tokens ({max_new_tokens}) exceed the "
            f"target's context of {context} tokens; the answer will stop early"
        )
    return None


def context_length(target) -> int | None:
    """The target's maximum positions, from its config (``None`` when it does not say)."""
    c = target.config
    return getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)
