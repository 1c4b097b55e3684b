"""How a published DFlash checkpoint is recognised: by its ``config.json`` (z-lab's, or a
vLLM/SGLang export), which names ``DFlashDraftModel`` or carries a ``dflash_config`` section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.heads.checkpoint import CONFIG_NAME
from draftheads.heads.layouts import OfficialCheckpoint, weight_files

DFLASH_ARCHITECTURE = "DFlashDraftModel"  # z-lab's class name, also what vLLM and SGLang register
# what the layout-detection refusal names as DFlash's mark
HINT = f"a config.json naming {DFLASH_ARCHITECTURE}"


def is_dflash_config(config: dict[str, Any]) -> bool:
    """True for a DFlash drafter's ``config.json``: it names ``DFlashDraftModel`` or carries a
    ``dflash_config`` section."""
    architectures = config.get("architectures") or []
    return DFLASH_ARCHITECTURE in architectures or isinstance(config.get("dflash_config"), dict)


def detect_files(directory: Path, config: dict[str, Any]) -> OfficialCheckpoint | None:
    """The DFlash checkpoint that ``config`` describes, else None; a DFlash config without weights
    is an incomplete download."""
    if not is_dflash_config(config):
        return None
    files = weight_files(directory)
    if not files:
        raise UserError(
            f"{directory / CONFIG_NAME} describes a DFlash drafter but {directory} holds no model.safetensors "
            "(or pytorch_model.bin); the download is incomplete"
        )
    return OfficialCheckpoint("dflash", directory, files, config)
