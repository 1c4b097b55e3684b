"""The interface every drafter implements, and the checkpoint format they share.

A drafter is an ``nn.Module`` that reads some of the frozen target's hidden states and
proposes future tokens. Training and decoding only rely on this small surface:

* ``kind``: the kind's name (a record's in ``draftheads.conf.schema.kinds.BUILTIN_KINDS``; see
  :mod:`draftheads.heads.kinds`, which holds what each kind is beside its model);
* ``feature_layers()`` / ``select_features(hidden_states)``: which entries of the target's
  ``output_hidden_states`` tuple the drafter reads (index ``i`` is the input of layer ``i``;
  index ``num_layers`` is the final, normed state that the target's lm_head sees);
* ``attach(target)``: bind the target's frozen embedding and lm_head at run time. They are
  held outside the module tree, so they never reach an optimizer or a checkpoint;
* ``save_pretrained(dir)`` / ``from_pretrained(dir or hub id)``.

On disk a drafter is ``config.json`` (kind, format version, every shape hyper-parameter, the
target fingerprint and the training provenance) plus ``model.safetensors``. Loading is strict
and never unpickles anything.

``Drafter`` is a ``huggingface_hub.PyTorchModelHubMixin``: the mixin's ``save_pretrained`` /
``from_pretrained`` / ``push_to_hub`` entry points are kept, with their work done here, because
a drafter's checkpoint is more than its ``__init__`` arguments: loading needs the target (the
fingerprint check, official layouts, the target's LoRA adapters for heads trained with them), files
land atomically, and the model card is the one of :mod:`draftheads.heads.card`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import torch
from huggingface_hub import PyTorchModelHubMixin
from safetensors.torch import save_file
from torch import nn

from draftheads.heads.checkpoint import (
    CONFIG_NAME,
    FORMAT_VERSION,
    WEIGHTS_NAME,
    attach_adapters,
    check_finite,
    check_state,
    load_checkpoint,
    package_version,
    read_config,
    read_weights,
    resolve_checkpoint_dir,
)
from draftheads.heads.convert.official import (
    check_tensors,
    convert_official,
    detect_layout,
    import_provenance,
)
from draftheads.heads.files import atomic_write
from draftheads.heads.kinds import drafter_kind
from draftheads.heads.target.fingerprint import TargetFingerprint, fingerprint

__all__ = [
    "CONFIG_NAME",
    "FORMAT_VERSION",
    "WEIGHTS_NAME",
    "Drafter",
    "read_config",
    "read_weights",
    "resolve_checkpoint_dir",
]


class Drafter(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="draftheads",
    pipeline_tag="text-generation",
    tags=["speculative-decoding"],
):
    """Base class of every drafter (:class:`MedusaHeads`, :class:`EagleDrafter`, :class:`DFlashDrafter`).

    A subclass sets ``kind``; the kind's other facts are its record's
    (:class:`~draftheads.conf.schema.kinds.record.KindRecord`).
    """

    kind: ClassVar[str] = ""

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

    @classmethod
    def saved_spec(cls, spec: dict[str, Any]) -> dict[str, Any]:
        """A saved ``config.json`` spec as the constructor takes it today (a kind whose format
        changed fills in, or refuses in one line, what older files lack)."""
        return spec

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

    # ---- decoding facts (what shapes the draft trees) ------------------------------------
    # drafts trees as it goes (dynamic trees, Li et al., 2024; DDTree); else static only
    dynamic_trees: ClassVar[bool] = True

    def tree_width(self) -> int | None:
        """Heads a static tree's depths index (one head drafts each depth), or None: any depth."""
        return None

    def draft_depth(self) -> int | None:
        """The most tokens one draft reaches (a block drafter's block minus its root), or None: no limit."""
        return None

    def depth_limit(self) -> str:
        """Why the draft stops at :meth:`draft_depth`, as a clause for a refusal."""
        return f"the drafter drafts at most {self.draft_depth()} tokens"

    def state_to_save(self) -> dict[str, torch.Tensor]:
        """Tensors written to model.safetensors: the drafter's own parameters and buffers."""
        return {k: v.detach().contiguous() for k, v in self.state_dict().items()}

    # ---- checkpoint ------------------------------------------------------------------
    def kind_config(self) -> dict[str, Any]:
        """The part of :meth:`config_dict` a kind's facts read (``DrafterKind`` methods take it):
        the kind and the shape spec."""
        return {"kind": self.kind, "spec": self.spec()}

    def config_dict(self) -> dict[str, Any]:
        return {
            "draftheads_version": package_version(),
            "format_version": FORMAT_VERSION,
            **self.kind_config(),
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
        atomic_write(out / WEIGHTS_NAME, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
        atomic_write(
            out / CONFIG_NAME, lambda p: p.write_text(json.dumps(self.config_dict(), indent=2) + "\n")
        )
        return out

    def _save_pretrained(self, save_directory: Path) -> None:
        """The mixin's save hook: the draftheads files, written atomically."""
        self.save_pretrained(save_directory)

    def generate_model_card(self, *args: Any, **kwargs: Any):
        """The mixin's model card hook: the draftheads card (:mod:`draftheads.heads.card`)."""
        from draftheads.heads.card import model_card

        return model_card(self.config_dict())

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None = None, **kwargs: Any) -> Drafter:
        """The mixin's load hook: :meth:`from_pretrained` with ``target``/``tokenizer``/``map_location``."""
        keep = {k: kwargs[k] for k in ("target", "tokenizer", "map_location") if k in kwargs}
        return cls.from_pretrained(model_id, revision=revision, **keep)

    def push_to_hub(
        self, repo_id: str, private: bool = False, revision: str | None = None, **kwargs: Any
    ) -> str:
        """Upload this drafter with a model card (see :mod:`draftheads.heads.hub`); returns the commit URL."""
        import tempfile

        from draftheads.heads.hub import push_folder

        with tempfile.TemporaryDirectory(prefix="draftheads-push-") as tmp:
            self.save_pretrained(tmp)
            return push_folder(tmp, repo_id, private=private, revision=revision, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike,
        target: nn.Module | None = None,
        tokenizer: Any = None,
        revision: str | None = None,
        map_location: str | torch.device = "cpu",
    ) -> Drafter:
        """Load a drafter strictly; with ``target``, check the fingerprint and attach it.

        The one loader every command uses. A kind's official layout (``DrafterKind.layouts``) is
        converted for ``target``. Heads trained with LoRA adapters on the target get those adapters
        put on ``target`` (in place) when it has none, so the returned drafter decodes with the
        adapted target. Weights with NaN or infinity, or for another target (shape, architecture,
        weights, tokenizer), are refused.
        """
        directory = resolve_checkpoint_dir(path_or_repo, revision)
        official = detect_layout(directory)
        if official is not None:
            fp = fingerprint(target, tokenizer) if target is not None else None
            kind, spec, tensors = convert_official(
                official, target, fp, expected_kind=cls.kind or None, tokenizer=tokenizer
            )
            model = drafter_kind(kind).drafter(fp, **spec)
            check_tensors(model.state_dict(), tensors, official, fp)
            check_finite(tensors, official.where())
            model.load_state_dict(tensors, strict=True)
            model.provenance = import_provenance(official, str(path_or_repo), revision)
            return model.to(map_location).attach(target)
        model = load_checkpoint(directory, expected_kind=cls.kind or None).to(map_location)
        if target is None:
            return model
        if tokenizer is not None:
            model.target_fingerprint.check_compatible(fingerprint(target, tokenizer))
        if model.requires_adapters:
            attach_adapters(target, directory)
        return model.attach(target)

    def load_checked(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        """``load_state_dict(strict=True)`` after key, shape and finiteness checks, with one-line errors."""
        check_state(self.state_dict(), tensors, where)
        check_finite(tensors, where)
        self.load_state_dict(tensors, strict=True)
