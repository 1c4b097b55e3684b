"""Checks a command runs on its inputs before any work starts, so a mistake costs nothing.

Each raises :class:`UserError` with one line naming the key and the fix, and none of them
changes anything on disk. Output folders go through :func:`draftheads.data.outdir.guard_out_dir`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
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


def decode_fits(command: str, decode: DecodeConfig) -> None:
    """The decoding settings of a command that decodes prompt by prompt: no ``decode.batch_size``
    (:func:`unbatched`), and a verify-cost cache it can write (:func:`cost_cache_writable`)."""
    unbatched(command, decode)
    cost_cache_writable(decode)


def something_drafts(heads: str | None, decode: DecodeConfig) -> None:
    """Refuse ``heads=none`` with lookup off: then nothing proposes drafts to verify."""
    if heads == "none" and not (decode.lookup and decode.lookup_tokens > 0):
        off = f"decode.lookup_tokens={decode.lookup_tokens}" if decode.lookup else "decode.lookup=false"
        raise UserError(
            f"heads=none with {off}: there is no drafter and prompt lookup is off, so nothing proposes "
            "drafts; give heads=DIR, or turn lookup on (decode.lookup=true decode.lookup_tokens=6)"
        )


def cost_cache_writable(decode: DecodeConfig) -> None:
    """Refuse a ``decode.cost_cache`` that is a file or cannot be created or written: the curve
    would be measured again on every run. Changes nothing on disk."""
    from draftheads.data.outdir import writable_dir

    if decode.cost_cache:
        writable_dir(decode.cost_cache, "decode.cost_cache")


def unbatched(command: str, decode: DecodeConfig) -> None:
    """Refuse ``decode.batch_size`` other than 1 for a command that decodes one prompt at a time
    (it would be ignored); ``draftheads speed`` measures batches, with ``speed.batch_sizes``."""
    if decode.batch_size != 1:
        raise UserError(
            f"decode.batch_size={decode.batch_size}: {command} decodes one prompt at a time and does not "
            f"read it; drop decode.batch_size (`draftheads speed speed.batch_sizes=[1,{decode.batch_size}]` "
            "measures batches)"
        )
