"""Import a kind's official checkpoints: detect the layout, map the keys, load strictly.

``Drafter.from_pretrained(dir_or_hub_id, target=model)`` calls :func:`detect_layout` and, when
the directory is not a draftheads checkpoint, :func:`convert_official`, which returns the
drafter's kind, its constructor arguments and its tensors under our names; the drafter
classes are built by the caller, so this module never imports them.

Each kind lists its published layouts (``DrafterKind.layouts``: a name, how a directory of it is
recognised) and converts them in its own folder (``heads/<kind>/convert.py``, whose docstring
gives the files and keys; ``docs/hub.md`` tabulates them all). This module picks the converter
for the layout, checks the tensors against the built drafter, and records where an import came
from.

Why the target is required: official files carry no usable fingerprint (a published config may
even get the drafter's own shape wrong; a kind's converter then reads it from the keys), so the
drafter is built for the target the user loads it with, every tensor's shape is checked against
that target, and the fingerprint is taken from it. Pickles are read with
``torch.load(weights_only=True)`` only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.kinds import layout_kind
from draftheads.heads.layouts import OfficialCheckpoint, detect_layout
from draftheads.heads.speculators import check_verifier
from draftheads.heads.speculators_checks import check_eagle_layer_ids
from draftheads.heads.target.fingerprint import TargetFingerprint

__all__ = ["OfficialCheckpoint", "convert_official", "detect_layout", "import_provenance"]


def check_tensors(
    own: dict[str, torch.Tensor],
    tensors: dict[str, torch.Tensor],
    ckpt: OfficialCheckpoint,
    fp: TargetFingerprint,
) -> None:
    """Strict key and shape check against the built drafter's state ``own``, naming the file and the target."""
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise UserError(
            f"{ckpt.where()}: keys do not match an {ckpt.layout} drafter for this target "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); the checkpoint is incomplete or another layout"
        )
    base = ckpt.config.get("base_model_name_or_path") or ckpt.config.get("_name_or_path")
    for k, v in own.items():
        if tuple(v.shape) != tuple(tensors[k].shape):
            raise UserError(
                f"{ckpt.where()}: tensor {k} has shape {tuple(tensors[k].shape)} but target "
                f"{fp.short()} needs {tuple(v.shape)}; it was trained for another "
                f"target{f' ({base})' if base else ''}"
            )


def convert_official(
    ckpt: OfficialCheckpoint,
    target: nn.Module | None,
    fp: TargetFingerprint | None,
    expected_kind: str | None = None,
    tokenizer: Any = None,
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """The official checkpoint ``ckpt`` as (kind, constructor arguments, tensors) for ``target``.

    ``target`` is required: the drafter's shapes and fingerprint come from it. With ``tokenizer``
    the arguments are also checked against it (``DrafterKind.import_problem``).
    """
    if target is None or fp is None:
        raise UserError(
            f"{ckpt.where()} is an official checkpoint; importing it needs its target model: "
            "Drafter.from_pretrained(path, target=model, tokenizer=tok), or target=... on the command line"
        )
    if ckpt.origin == "speculators":
        check_verifier(ckpt.source_config, fp.name, fp.architecture, ckpt.where())
        check_eagle_layer_ids(ckpt.source_config, fp.num_layers, ckpt.where())
    owner, build = layout_kind(ckpt.layout)
    kind = owner.name
    if expected_kind and expected_kind != kind:
        raise UserError(
            f"{ckpt.where()} holds a drafter of kind {kind!r}, not {expected_kind!r}; use Drafter.from_pretrained"
        )
    kind, spec, tensors = build(ckpt, target, fp)
    problem = owner.import_problem(spec, tokenizer, ckpt.origin) if tokenizer is not None else None
    if problem:
        raise UserError(f"{ckpt.where()}: {problem}")
    if ckpt.origin == "speculators":
        check_draft_vocab(ckpt.source_config.get("draft_vocab_size"), spec["draft_vocab_size"], ckpt.where())
    return kind, spec, tensors


def check_draft_vocab(given: Any, held: int, where: str) -> None:
    """A speculators config's ``draft_vocab_size`` must be the draft vocabulary its tensors hold
    (lm_head rows, ``d2t``): the engines size the drafter from the config."""
    if given != held:
        raise UserError(
            f"{where}: config.json has draft_vocab_size={given!r}, but its tensors hold a draft vocabulary "
            f"of {held} (lm_head rows and d2t); the engines read the config's value, so set "
            f"draft_vocab_size={held} in config.json (or export the drafter again)"
        )


def import_provenance(ckpt: OfficialCheckpoint, source: str | None, revision: str | None) -> dict[str, Any]:
    """What an imported drafter records about where it came from."""
    speculators = ckpt.origin == "speculators"
    return {
        "imported_from": {
            "layout": f"speculators-{ckpt.source_config['speculators_model_type']}"
            if speculators
            else ckpt.layout,
            "source": source or str(ckpt.directory),
            "revision": revision,
            "files": [f.name for f in ckpt.files],
            "config": ckpt.source_config if speculators else ckpt.config,
        }
    }
