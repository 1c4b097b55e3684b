"""Official drafter checkpoints on disk: reading their files and recognising the layout.

Each kind recognises its own layouts (``heads/<kind>/layout.py``, asked through the kind's
:meth:`~draftheads.heads.kinds.DrafterKind.detect_files` and
:meth:`~draftheads.heads.kinds.DrafterKind.classify_keys`); :func:`detect_layout` asks the kinds in
the order of their records. See :mod:`draftheads.heads.convert.official` for the layouts and their
conversion. Pickles are read with
``torch.load(weights_only=True)`` only; safetensors headers are read without loading tensors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from draftheads.conf.errors import UserError
from draftheads.heads.checkpoint import CONFIG_NAME
from draftheads.heads.kinds import KINDS
from draftheads.heads.speculators import is_speculators_config, readable_types, speculators_layout
from draftheads.heads.speculators_checks import check_layer_config

SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"


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
    for kind in KINDS.values():
        found = kind.detect_files(directory, config)
        if found is not None:
            return found
    files = weight_files(directory)
    if not files:
        return None
    keys = list_keys(files)
    layout = next((layout for kind in KINDS.values() if (layout := kind.classify_keys(keys, files))), None)
    if layout is None:
        raise UserError(
            f"{directory}: neither a draftheads checkpoint (config.json with 'kind') nor an official drafter "
            f"layout ({', '.join(k.layout_hint for k in KINDS.values() if k.layout_hint)}) in {files[0].name}"
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
