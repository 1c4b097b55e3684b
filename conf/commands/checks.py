"""Checks a command runs on its inputs before any work starts, so a mistake costs nothing.

Each raises :class:`UserError` with one line naming the key and the fix, and none of them
changes anything on disk. Output folders go through :func:`draftheads.data.outdir.guard_out_dir`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.data.outdir import writable_dir


def writable_file(path: str | os.PathLike, key: str) -> Path:
    """Refuse an output file whose folder cannot be written, or that is an existing directory."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise UserError(f"{key}={path} is a directory; give a file path")
    writable_dir(out.parent, key)
    return out


def drafter_digest(directory: str | os.PathLike) -> str | None:
    """SHA-256 of a drafter's ``model.safetensors``: the identity an eval report records, so that
    ``push`` quotes a report only on the drafter it measured (None: no weights file)."""
    path = Path(directory) / "model.safetensors"
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
