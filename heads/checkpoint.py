"""The files of a draftheads checkpoint: names, reading, checking and atomic writing.

A checkpoint directory holds ``config.json`` (kind, format version, shape spec, target
fingerprint, provenance), ``model.safetensors`` and, for heads trained with LoRA adapters on the
target, those adapters in ``adapter/``. Nothing here builds a drafter (see
:mod:`draftheads.heads.base`), so every module of ``heads/`` can read checkpoints without importing
the drafter classes.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from draftheads.conf.errors import UserError
from draftheads.heads.kinds import drafter_kind
from draftheads.heads.target.fingerprint import TargetFingerprint

FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
ADAPTER_DIR = "adapter"  # LoRA adapters on the target: peft's adapter_config.json + adapter_model.safetensors
# Files whose presence marks a directory as holding a drafter (ours or an official layout).
CHECKPOINT_FILES = (
    CONFIG_NAME,
    WEIGHTS_NAME,
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "medusa_lm_head.safetensors",
    "medusa_lm_head.pt",
)


def package_version() -> str:
    """The installed draftheads version, recorded in every config.json."""
    try:
        return version("draftheads")
    except PackageNotFoundError:
        return "unknown"


def holds_checkpoint(directory: Path) -> bool:
    """True when ``directory`` holds drafter files (draftheads or an official layout)."""
    return directory.is_dir() and any((directory / name).exists() for name in CHECKPOINT_FILES)


def resolve_checkpoint_dir(path_or_repo: str | os.PathLike, revision: str | None = None) -> Path:
    """A local directory as is; anything else is treated as a hub repo id and downloaded (or read from cache)."""
    p = Path(path_or_repo).expanduser()
    if p.is_dir():
        return p
    s = str(path_or_repo)
    if p.exists() or s.startswith((".", "/", "~")) or s.count("/") != 1:
        raise UserError(
            f"heads={s}: no such checkpoint directory; pass a directory with config.json or a hub id ORG/NAME"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id=s, revision=revision))
    except (RepositoryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"heads={s}: cannot fetch it from the Hugging Face Hub ({first}); check the repo id, revision and network, or pass a local directory"
        ) from None


def read_config(directory: Path) -> dict[str, Any]:
    """A draftheads ``config.json``; one-line errors for a missing, corrupt or foreign file."""
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise UserError(f"{directory}: no {CONFIG_NAME}; this is not a draftheads checkpoint directory")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(
            f"{path} is not valid JSON ({e}); the file is truncated or corrupt, re-save or re-download it"
        ) from None
    if not isinstance(cfg, dict) or "kind" not in cfg or "spec" not in cfg:
        raise UserError(
            f"{path} is not a draftheads drafter config (no 'kind'/'spec'), and no published drafter's "
            "weights (a kind's official layout or a speculators export) lie beside it; give a folder "
            "`draftheads train` wrote, or a published drafter's folder with its weights (loaded with "
            "target=...)"
        )
    if int(cfg.get("format_version", 0)) > FORMAT_VERSION:
        raise UserError(
            f"{path} has format_version {cfg['format_version']}, newer than this draftheads supports ({FORMAT_VERSION}); upgrade draftheads"
        )
    return cfg


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """``model.safetensors`` as tensors (never a pickle); one-line errors for a damaged file."""
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise UserError(
            f"{directory}: no {WEIGHTS_NAME}; the checkpoint is incomplete, re-save or re-download it"
        )
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is truncated or corrupt ({first}); re-save or re-download it") from None


def check_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    """Refuse weights holding NaN or infinity: such a drafter proposes garbage (τ 1.00) silently."""
    for name in sorted(tensors):
        t = tensors[name]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise UserError(
                f"{where}: tensor {name} holds NaN or infinite values; the training diverged or the file "
                "is damaged, use an earlier checkpoint or retrain"
            )


def check_state(own: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], where: str) -> None:
    """``tensors`` has exactly the keys and shapes of the drafter state ``own``; a one-line error if not."""
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise UserError(
            f"{where} does not match the drafter in {CONFIG_NAME} "
            f"(missing {missing[:3]}{'…' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
            f"{'…' if len(unexpected) > 3 else ''}); the checkpoint is from another drafter or damaged"
        )
    for k, v in own.items():
        if tuple(v.shape) != tuple(tensors[k].shape):
            raise UserError(
                f"{where}: tensor {k} has shape {tuple(tensors[k].shape)}, {CONFIG_NAME} implies {tuple(v.shape)}; the checkpoint is damaged"
            )


def attach_adapters(target: Any, directory: Path) -> Any:
    """Put the LoRA adapters saved in ``directory/adapter`` on ``target``, in place.

    transformers' ``load_adapter`` keeps the target's class, so fingerprints and the decoder
    work unchanged. A target that already carries adapters (peft) is left as it is.
    """
    if getattr(target, "peft_config", None):
        return target
    path = directory / ADAPTER_DIR
    if not (path / "adapter_config.json").is_file():
        raise UserError(
            f"{directory} holds heads trained with LoRA adapters on the target, but its "
            f"{ADAPTER_DIR}/adapter_config.json is missing; re-save or re-download the whole checkpoint"
        )
    target.load_adapter(str(path))
    target.requires_grad_(False)
    return target.eval()


def load_checkpoint(directory: Path, expected_kind: str | None = None) -> Any:
    """Build the drafter that ``directory`` holds and load its weights, strictly.

    Refuses (one line) an unknown kind, another kind than ``expected_kind``, a spec the class
    rejects, weights that disagree with ``config.json`` in keys or shapes, and NaN/inf weights.
    This is what loading, ``draftheads info`` and ``draftheads push`` all check.
    """
    cfg = read_config(directory)
    kind = cfg.get("kind")
    cls = drafter_kind(str(kind), f"{directory / CONFIG_NAME}: drafter kind").drafter
    if expected_kind and kind != expected_kind:
        raise UserError(
            f"{directory} holds a {kind} drafter, not a {expected_kind}; load it with Drafter.from_pretrained"
        )
    fp = TargetFingerprint.from_dict(cfg.get("target") or {})
    try:
        model = cls(**cls.saved_spec(cfg["spec"]), target=fp)
    except (TypeError, KeyError, ValueError) as e:
        raise UserError(
            f"{directory / CONFIG_NAME}: invalid drafter spec ({e}); the file is damaged or from another tool"
        ) from None
    model.provenance = cfg.get("provenance") or {}
    model.source_dir = directory
    model.requires_adapters = bool(cfg.get("requires_adapters", False))
    model.load_checked(read_weights(directory), str(directory / WEIGHTS_NAME))
    return model
