"""Start a P-EAGLE drafter from a trained EAGLE-3 drafter (``draft.peagle.init_from_eagle3``).

P-EAGLE's drafter is EAGLE-3's plus two inputs of its own (``mask_hidden`` and the mask token's
embedding, or the whole table with ``own_embedding``), so every other tensor of an EAGLE-3
drafter of the same shape (fc, the decoder layers, the norms, the head and the vocabulary maps)
can start it. The EAGLE-3 drafter must be for the same target and have the same feature layers,
draft vocabulary size, layer count and norm variants; each difference is refused in one line
before training starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.checkpoint import read_config, read_weights, resolve_checkpoint_dir
from draftheads.heads.layouts import detect_layout
from draftheads.heads.speculators import EAGLE3_FLAGS
from draftheads.heads.target.fingerprint import TargetFingerprint

# spec keys of the EAGLE-3 drafter that must equal the P-EAGLE drafter's (each a draft.* key)
SAME = ("feature_layers", "draft_vocab_size", "num_decoder_layers")


def eagle3_checkpoint(source: str) -> tuple[Path, dict[str, Any]]:
    """The EAGLE-3 drafter's folder and config; anything else is refused naming what it is."""
    where = f"draft.peagle.init_from_eagle3={source}"
    try:
        directory = resolve_checkpoint_dir(source)
        official = detect_layout(directory)
    except UserError as e:  # named by the key the user typed, not heads=
        raise UserError(f"{where}: {str(e).removeprefix(f'heads={source}: ')}") from None
    if official is not None:
        raise UserError(
            f"{where} is a {official.origin or 'published'} {official.layout} checkpoint, not a draftheads "
            "drafter folder; P-EAGLE starts from a draftheads EAGLE-3 drafter: train one with "
            "`draftheads train draft=eagle3 train.out_dir=DIR` and give draft.peagle.init_from_eagle3=DIR, or drop "
            "draft.peagle.init_from_eagle3"
        )
    try:
        cfg = read_config(directory)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    if cfg["kind"] != "eagle" or cfg["spec"].get("version") != 3:
        what = f"an EAGLE-{cfg['spec'].get('version')}" if cfg["kind"] == "eagle" else f"a {cfg['kind']}"
        raise UserError(f"{where} is {what} drafter, not EAGLE-3; give a drafter trained with draft=eagle3")
    return directory, cfg


def check_matches(cfg: dict[str, Any], spec: dict[str, Any], fp: TargetFingerprint, where: str) -> None:
    """The EAGLE-3 drafter was trained for this target, with this drafter's shape."""
    TargetFingerprint.from_dict(cfg["target"]).check_compatible(fp, what=where)
    theirs = cfg["spec"]
    for key in SAME:
        if theirs.get(key) != spec.get(key):
            raise UserError(
                f"{where} has {key}={theirs.get(key)} but this P-EAGLE drafter {spec.get(key)}; "
                f"set draft.peagle.{key}={theirs.get(key)}"
            )
    for flag in EAGLE3_FLAGS:
        if bool(theirs.get(flag)) != bool(spec.get(flag)):
            raise UserError(
                f"{where} has {flag}={bool(theirs.get(flag))}; set draft.peagle.{flag}={str(bool(theirs.get(flag))).lower()}"
            )


@torch.no_grad()
def start_from_eagle3(drafter: Any, source: str) -> list[str]:
    """Copy the EAGLE-3 drafter's tensors into ``drafter``; returns the P-EAGLE tensors it left
    (the mask inputs). A tensor of another shape, or one P-EAGLE lacks, is refused."""
    where = f"draft.peagle.init_from_eagle3={source}"
    directory, cfg = eagle3_checkpoint(source)
    check_matches(cfg, drafter.spec(), drafter.target_fingerprint, where)
    tensors = read_weights(directory)
    own = drafter.state_dict()
    strange = sorted(k for k in tensors if k not in own)
    wrong = sorted(k for k in tensors if k in own and tuple(own[k].shape) != tuple(tensors[k].shape))
    if strange or wrong:
        bad = [f"unexpected {k}" for k in strange] + [
            f"{k} of shape {tuple(tensors[k].shape)}" for k in wrong
        ]
        raise UserError(
            f"{where} does not fit this P-EAGLE drafter ({'; '.join(bad[:3])}); train it with draft=eagle3"
        )
    for k, t in tensors.items():
        own[k].copy_(t.to(own[k].dtype))
    return sorted(k for k in own if k not in tensors)
