"""The interface every drafter implements, and the checkpoint format they share.

A drafter is an ``nn.Module`` that reads some of the frozen target's hidden states and
proposes future tokens. Training and decoding only rely on this small surface:

* ``kind``: ``"medusa"`` or ``"eagle"``;
* ``feature_layers()`` / ``select_features(hidden_states)``: which entries of the target's
  ``output_hidden_states`` tuple the drafter reads (index ``i`` is the input of layer ``i``;
  index ``num_layers`` is the final, normed state that the target's lm_head sees);
* ``attach(target)``: bind the target's frozen embedding and lm_head at run time. They are
  held outside the module tree, so they never reach an optimizer or a checkpoint;
* ``save_pretrained(dir)`` / ``from_pretrained(dir or hub id)``.

On disk a drafter is ``config.json`` (kind, format version, every shape hyper-parameter, the
target fingerprint and the training provenance) plus ``model.safetensors``. Loading is strict
and never unpickles anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.target import TargetFingerprint, fingerprint

FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class Drafter(nn.Module):
    """Base class of :class:`MedusaHeads` and :class:`EagleDrafter`."""

    kind: ClassVar[str] = ""
    registry: ClassVar[dict[str, type[Drafter]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            Drafter.registry[cls.kind] = cls

    def __init__(self, target: TargetFingerprint) -> None:
        super().__init__()
        self.target_fingerprint = target
        self.provenance: dict[str, Any] = {}
        self.requires_adapters = False
        self.source_dir: Path | None = None  # where it was loaded from (tree.json, adapters live there)
        # Shared, frozen target modules live in a plain dict so that nn.Module does not
        # register them: they are excluded from parameters(), state_dict() and optimizers.
        self._shared: dict[str, nn.Module] = {}

    # ---- interface -------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        """Every constructor argument except the fingerprint; written to config.json."""
        raise NotImplementedError

    def feature_layers(self) -> list[int]:
        """Indices into the target's ``hidden_states`` tuple that this drafter reads."""
        return [self.target_fingerprint.num_layers]

    def training_layers(self) -> list[int]:
        """Hidden states training reads: the inputs, plus whatever the loss compares against.

        Equal to ``DraftConfig.training_layers`` for the config that built this drafter; a
        feature cache for training this drafter must hold exactly these.
        """
        return self.feature_layers()

    def select_features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Concatenate the target hidden states this drafter reads: ``[B, T, F]``."""
        feats = [hidden_states[i] for i in self.feature_layers()]
        return feats[0] if len(feats) == 1 else torch.cat(feats, dim=-1)

    def attach(self, target: nn.Module, check: bool = True) -> Drafter:
        """Bind the target's frozen embedding and lm_head (and whatever else is shared)."""
        if check:  # structure only; from_pretrained(tokenizer=...) also checks the tokenizer hash
            self.target_fingerprint.check_compatible(fingerprint(target, None))
        self._shared["embed"] = target.get_input_embeddings()
        self._shared["lm_head"] = target.get_output_embeddings()
        return self

    def shared(self, name: str) -> nn.Module:
        if name not in self._shared:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a target; call .attach(target) first"
            )
        return self._shared[name]

    def state_to_save(self) -> dict[str, torch.Tensor]:
        """Tensors written to model.safetensors: the drafter's own parameters and buffers."""
        return {k: v.detach().contiguous() for k, v in self.state_dict().items()}

    # ---- checkpoint ------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        from draftheads.conf import __version__

        return {
            "draftheads_version": __version__,
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "spec": self.spec(),
            "target": self.target_fingerprint.to_dict(),
            "requires_adapters": self.requires_adapters,
            "provenance": self.provenance,
        }

    def save_pretrained(
        self, save_directory: str | os.PathLike, extra_tensors: dict[str, torch.Tensor] | None = None
    ) -> Path:
        """Write ``config.json`` and ``model.safetensors``; each file lands atomically."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.to("cpu") for k, v in self.state_to_save().items()}
        tensors.update(extra_tensors or {})
        _atomic_write(out / WEIGHTS_NAME, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
        _atomic_write(
            out / CONFIG_NAME, lambda p: p.write_text(json.dumps(self.config_dict(), indent=2) + "\n")
        )
        return out

    def push_to_hub(
        self, repo_id: str, private: bool = False, revision: str | None = None, **kwargs: Any
    ) -> str:
        """Upload this drafter with a model card (see :mod:`draftheads.heads.hub`); returns the commit URL."""
        from draftheads.heads.hub import push_drafter

        return push_drafter(self, repo_id, private=private, revision=revision, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike,
        target: nn.Module | None = None,
        tokenizer: Any = None,
        revision: str | None = None,
        map_location: str | torch.device = "cpu",
    ) -> Drafter:
        """Load a drafter strictly. With ``target`` (and ``tokenizer``), check the fingerprint and attach."""
        directory = resolve_checkpoint_dir(path_or_repo, revision)
        from draftheads.heads.convert import detect_layout, import_official

        official = detect_layout(directory)
        if official is not None:  # an official Medusa/EAGLE layout: convert it for this target
            return import_official(
                directory,
                target,
                tokenizer,
                source=str(path_or_repo),
                revision=revision,
                map_location=map_location,
                expected_kind=cls.kind or None,
                ckpt=official,
            )
        cfg = read_config(directory)
        kind = cfg.get("kind")
        if kind not in Drafter.registry:
            raise UserError(
                f"{directory / CONFIG_NAME}: unknown drafter kind {kind!r}; expected one of {sorted(Drafter.registry)}"
            )
        klass = Drafter.registry[kind]
        if cls is not Drafter and klass is not cls:
            raise UserError(
                f"{directory} holds a {kind} drafter, not a {cls.kind}; load it with Drafter.from_pretrained"
            )
        fp = TargetFingerprint.from_dict(cfg.get("target") or {})
        if target is not None and tokenizer is not None:
            fp.check_compatible(fingerprint(target, tokenizer))
        try:
            model = klass(**cfg["spec"], target=fp)
        except (TypeError, KeyError, ValueError) as e:
            raise UserError(
                f"{directory / CONFIG_NAME}: invalid drafter spec ({e}); the file is damaged or from another tool"
            ) from None
        model.provenance = cfg.get("provenance") or {}
        model.source_dir = directory
        model.requires_adapters = bool(cfg.get("requires_adapters", False))
        if model.requires_adapters and target is not None and not getattr(target, "peft_config", None):
            raise UserError(
                f"{directory} holds Medusa-2 heads trained with LoRA adapters on the target, but the target has none; load them first: draftheads.train.adapters.load_adapters(target, '{directory}')"
            )
        tensors = read_weights(directory)
        model.load_checked(tensors, str(directory / WEIGHTS_NAME))
        model.to(map_location)
        if target is not None:
            model.attach(target)
        return model

    def load_checked(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        """``load_state_dict(strict=True)`` with shape checks and a one-line error."""
        own = self.state_dict()
        missing = sorted(set(own) - set(tensors))
        unexpected = sorted(set(tensors) - set(own))
        if missing or unexpected:
            raise UserError(
                f"{where} does not match the drafter in config.json "
                f"(missing {missing[:3]}{'…' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                f"{'…' if len(unexpected) > 3 else ''}); the checkpoint is from another drafter or damaged"
            )
        for k, v in own.items():
            if tuple(v.shape) != tuple(tensors[k].shape):
                raise UserError(
                    f"{where}: tensor {k} has shape {tuple(tensors[k].shape)}, config.json implies {tuple(v.shape)}; the checkpoint is damaged"
                )
        self.load_state_dict(tensors, strict=True)


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


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
            f"{path} is not a draftheads drafter config (no 'kind'/'spec'); official Medusa/EAGLE layouts load through Drafter.from_pretrained(dir, target=...)"
        )
    if int(cfg.get("format_version", 0)) > FORMAT_VERSION:
        raise UserError(
            f"{path} has format_version {cfg['format_version']}, newer than this draftheads supports ({FORMAT_VERSION}); upgrade draftheads"
        )
    return cfg


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
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
