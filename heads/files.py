"""Writing files that other processes read: never half a file, and with the mode the umask gives.

Checkpoints, feature caches, cost caches and prompt files all go through :func:`atomic_write`;
folders written by libraries (safetensors writes 0600 whatever the umask) get
:func:`follow_umask` afterwards, so an engine running as another user can read them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process's file-mode creation mask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """Give the file ``path`` (or every file under the folder ``path``) the mode a new file gets
    under the umask, ``0666 & ~umask``. safetensors (and the libraries that write through it)
    create weight files 0600 whatever the umask, which an engine running as another user cannot
    read."""
    mode = 0o666 & ~current_umask()
    root = Path(path)
    for f in [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file()):
        os.chmod(f, mode)


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """Write ``path`` through a temporary sibling and ``os.replace``: never half a file, and with
    the mode the umask gives new files."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        follow_umask(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
