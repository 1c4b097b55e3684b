"""Official Medusa, EAGLE and DFlash checkpoints on disk: reading their files and recognising the layout.

See :mod:`draftheads.heads.convert.official` for the layouts and their conversion. Pickles are read with
``torch.load(weights_only=True)`` only; safetensors headers are read without loading tensors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from draftheads.conf.errors import UserError
from draftheads.heads.checkpoint import CONFIG_NAME
from draftheads.heads.speculators import is_speculators_config, readable_types, speculators_layout
from draftheads.heads.speculators_checks import check_layer_config

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
MEDUSA2_PREFIX = "medusa_head."
DFLASH_ARCHITECTURE = "DFlashDraftModel"  # z-lab's class name, also what vLLM and SGLang register


@dataclass
class OfficialCheckpoint:
    """An official checkpoint found in ``directory``: its layout, weight files and config.

    A speculators checkpoint has ``origin="speculators"``, its own config in ``source_config``
    and, in ``config``, the engine-layout config of the same drafter (what the builders read).
    """

    layout: str
    directory: Path
    files: list[Path]
    config: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    source_config: dict[str, Any] = field(default_factory=dict)

    def where(self) -> str:
        names = ", ".join(f.name for f in self.files[:2]) + ("…" if len(self.files) > 2 else "")
        layout = f"{self.origin} {self.layout}" if self.origin else self.layout
        return f"{self.directory} ({layout}: {names})"


# ---- reading -------------------------------------------------------------------------------
def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when absent, unreadable or not an object."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def weight_files(directory: Path) -> list[Path]:
    """The full-checkpoint weight files in ``directory``, safetensors first, sharded or not."""
    for index, single in ((SAFETENSORS_INDEX, "model.safetensors"), (PICKLE_INDEX, "pytorch_model.bin")):
        idx = read_json(directory / index)
        if idx and isinstance(idx.get("weight_map"), dict):
            names = sorted(set(idx["weight_map"].values()))
            missing = [n for n in names if not (directory / n).is_file()]
            if missing:
                raise UserError(
                    f"{directory / index} lists {missing[0]}, which is missing; the download is incomplete"
                )
            return [directory / n for n in names]
        if (directory / single).is_file():
            return [directory / single]
    return []


def _load_pickle(path: Path) -> dict[str, torch.Tensor]:
    """A pickled state dict, read with ``weights_only=True`` (no code runs), memory-mapped if possible."""
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) pickles cannot be memory-mapped
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling raises many types; all mean the same thing to the user
        text = str(e).split("WeightsUnpickler error:", 1)[-1]  # torch's own detail, not its advice
        lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(e).__name__]
        first = lines[0][:200]
        raise UserError(
            f"{path}: cannot read it as a weights-only torch checkpoint ({first}); it is corrupt or holds code"
        ) from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"{path} does not hold a plain state dict of tensors")
    return sd


def iter_tensors(
    files: list[Path], keep: Callable[[str], bool] = lambda k: True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(key, tensor)`` for the keys that ``keep`` accepts, one tensor at a time for safetensors."""
    for path in files:
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    for k in f.keys():
                        if keep(k):
                            yield k, f.get_tensor(k)
            except (SafetensorError, OSError) as e:
                raise UserError(f"{path} is truncated or corrupt ({e}); re-download it") from None
        else:
            for k, v in _load_pickle(path).items():
                if keep(k):
                    yield k, v


def list_keys(files: list[Path]) -> list[str]:
    """All tensor names in ``files`` (safetensors: from the header only)."""
    keys: list[str] = []
    for path in files:
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    keys.extend(f.keys())
            except (SafetensorError, OSError) as e:
                raise UserError(f"{path} is truncated or corrupt ({e}); re-download it") from None
        else:
            keys.extend(_load_pickle(path))
    return keys


def read_tensors(files: list[Path], keep: Callable[[str], bool] = lambda k: True) -> dict[str, torch.Tensor]:
    return dict(iter_tensors(files, keep))


# ---- detection -----------------------------------------------------------------------------
def is_dflash_config(config: dict[str, Any]) -> bool:
    """True for a DFlash drafter's ``config.json`` (z-lab's, or a vLLM/SGLang export): it names
    ``DFlashDraftModel`` or carries a ``dflash_config`` section."""
    architectures = config.get("architectures") or []
    return DFLASH_ARCHITECTURE in architectures or isinstance(config.get("dflash_config"), dict)


EAGLE3_MARKS = ("d2t", "hidden_norm.weight", "midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight")


def classify_keys(keys: list[str], fc_in: int | None = None, hidden: int | None = None) -> str | None:
    """The official layout that a full checkpoint's tensor names imply, or None.

    EAGLE-3 is known by its own tensors, whatever its layer prefix (``midlayer.*`` or vLLM's
    ``layers.0.*``): a ``d2t`` map, a ``hidden_norm``, or an ``fc`` over three target states
    (``fc_in == 3 * hidden``). EAGLE-1 is ``fc`` over two states plus ``layers.{i}.*``.
    """
    if any(k.startswith(MEDUSA2_PREFIX) for k in keys):
        return "medusa-2"
    if any(k.startswith("midlayer.") for k in keys) or any(m in keys for m in EAGLE3_MARKS):
        return "eagle-3"
    if "fc.weight" in keys and fc_in is not None and hidden is not None and fc_in == 3 * hidden:
        return "eagle-3"
    if "fc.weight" in keys and any(k.startswith("layers.0.") for k in keys):
        return "eagle-1"
    return None


def fc_shape(files: list[Path]) -> tuple[int, int] | None:
    """``fc.weight``'s shape (out, in) from the first file that holds it (safetensors: header only)."""
    for path in files:
        if path.suffix != ".safetensors":
            t = _load_pickle(path).get("fc.weight")
            if t is not None:
                return int(t.shape[0]), int(t.shape[-1])
            continue
        try:
            with safe_open(str(path), framework="pt") as f:
                if "fc.weight" in f.keys():
                    shape = f.get_slice("fc.weight").get_shape()
                    return int(shape[0]), int(shape[-1])
        except (SafetensorError, OSError) as e:
            raise UserError(f"{path} is truncated or corrupt ({e}); re-download it") from None
    return None


def detect_layout(directory: Path) -> OfficialCheckpoint | None:
    """The official checkpoint in ``directory``; None for a draftheads checkpoint (or nothing to read).

    A ``config.json`` that is a draftheads config (it has ``kind``) or is not valid JSON is left to
    the draftheads loader, whose errors describe those cases.
    """
    cfg_path = directory / CONFIG_NAME
    config = read_json(cfg_path)
    if cfg_path.is_file() and (config is None or "kind" in config):
        return None
    config = config or {}
    if is_speculators_config(config):
        return speculators_checkpoint(directory, config)
    if is_dflash_config(config):
        files = weight_files(directory)
        if not files:
            raise UserError(
                f"{cfg_path} describes a DFlash drafter but {directory} holds no model.safetensors "
                "(or pytorch_model.bin); the download is incomplete"
            )
        return OfficialCheckpoint("dflash", directory, files, config)
    for name in MEDUSA_FILES:
        if (directory / name).is_file():
            keys = list_keys([directory / name])
            version = "v1" if _medusa_has_lm_heads(keys) else "v2"
            return OfficialCheckpoint(f"medusa-{version}", directory, [directory / name], config)
    files = weight_files(directory)
    if not files:
        return None
    keys = list_keys(files)
    shape = fc_shape(files) if "fc.weight" in keys else None
    layout = classify_keys(keys, *(shape[::-1] if shape else (None, None)))
    if layout is None:
        raise UserError(
            f"{directory}: neither a draftheads checkpoint (config.json with 'kind') nor an official Medusa, "
            f"EAGLE or DFlash layout (medusa_lm_head.*, medusa_head.*, fc + layers.0.*, midlayer.*, a config.json "
            f"naming {DFLASH_ARCHITECTURE}) in {files[0].name}"
        )
    return OfficialCheckpoint(layout, directory, files, config)


def speculators_checkpoint(directory: Path, config: dict[str, Any]) -> OfficialCheckpoint:
    """A speculators directory as the official layout of the same drafter (see
    :mod:`draftheads.heads.speculators`); its config is checked before any weight is read."""
    if config.get("speculators_model_type") in readable_types():
        check_layer_config(config, str(directory / CONFIG_NAME))
    layout, engine_config = speculators_layout(config, str(directory / CONFIG_NAME))
    files = weight_files(directory)
    if not files:
        raise UserError(
            f"{directory / CONFIG_NAME} describes a speculators {config['speculators_model_type']} drafter but "
            f"{directory} holds no model.safetensors; the download is incomplete"
        )
    return OfficialCheckpoint(layout, directory, files, engine_config, "speculators", config)


MEDUSA_KEY = re.compile(r"^(\d+)\.(\d+)\.(?:(linear)\.)?(weight|bias)$")


def _medusa_has_lm_heads(keys: list[str]) -> bool:
    return any((m := MEDUSA_KEY.match(k)) and m.group(3) is None for k in keys)
