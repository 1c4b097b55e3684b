"""How a published Medusa checkpoint is recognised: ``medusa_lm_head.*`` files (Medusa-1 with
their own lm_heads, ``medusa-v1``, or without, ``medusa-v2``) or ``medusa_head.*`` tensors in a
full checkpoint (Medusa-2, ``medusa-2``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from draftheads.heads.layouts import OfficialCheckpoint, list_keys

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
MEDUSA2_PREFIX = "medusa_head."
MEDUSA_KEY = re.compile(r"^(\d+)\.(\d+)\.(?:(linear)\.)?(weight|bias)$")
# what the layout-detection refusal names as Medusa's files and tensors
HINT = "medusa_lm_head.*, medusa_head.*"


def has_lm_heads(keys: list[str]) -> bool:
    """Whether Medusa-1 heads' tensors include their own lm_heads (``{head}.{layer}.weight``)."""
    return any((m := MEDUSA_KEY.match(k)) and m.group(3) is None for k in keys)


def detect_files(directory: Path, config: dict[str, Any]) -> OfficialCheckpoint | None:
    """A Medusa-1 checkpoint: a ``medusa_lm_head.*`` file in ``directory``, else None."""
    for name in MEDUSA_FILES:
        if (directory / name).is_file():
            keys = list_keys([directory / name])
            version = "v1" if has_lm_heads(keys) else "v2"
            return OfficialCheckpoint(f"medusa-{version}", directory, [directory / name], config)
    return None


def classify_keys(keys: list[str], files: list[Path]) -> str | None:
    """``medusa-2`` for a full checkpoint holding Medusa-2 heads (``medusa_head.*``), else None."""
    return "medusa-2" if any(k.startswith(MEDUSA2_PREFIX) for k in keys) else None
