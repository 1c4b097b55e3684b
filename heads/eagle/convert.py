"""Import official EAGLE-1 and EAGLE-3 checkpoints: map their keys to ours, read their layer config.

EAGLE-1 keys are ours already (``fc.*``, ``layers.{i}.*``); EAGLE-3's ``midlayer.*`` (or vLLM's
``layers.0.*`` with ``hidden_norm``) become ``layers.0.*`` and ``hidden_norm``, beside ``fc`` over
3H, ``norm``, ``lm_head`` and the vocabulary maps. The drafter's layers take the target's config
with the official layer's own sizes (:func:`eagle_layers`); its aux layers come from either engine's
config key.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.convert.target_copies import check_embedding
from draftheads.heads.draft_layers import llama_layers, own_sizes
from draftheads.heads.layouts import OfficialCheckpoint, read_tensors
from draftheads.heads.reduced_vocab import check_vocab_maps, t2d_from_d2t
from draftheads.heads.speculators import EAGLE3_FLAGS
from draftheads.heads.target.fingerprint import TargetFingerprint


def eagle1_tensors(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Official EAGLE-1 keys are ours, minus the embedding copy (a bias-less ``fc`` builds ``fc_bias=False``)."""
    return {k: v for k, v in sd.items() if k != "embed_tokens.weight"}


def eagle3_tensors(sd: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """Official EAGLE-3 keys -> ours: ``midlayer.hidden_norm`` (or vLLM's ``layers.0.hidden_norm``)
    -> ``hidden_norm``, ``midlayer.*`` -> ``layers.0.*``.

    A missing ``t2d`` (ModelOpt exports only ``d2t``) is rebuilt from ``d2t``.
    """
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == "embed_tokens.weight":
            continue
        if k in ("midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight"):
            out["hidden_norm.weight"] = v
        elif k.startswith("midlayer."):
            out["layers.0." + k[len("midlayer.") :]] = v
        else:
            out[k] = v
    if "d2t" in out and "t2d" not in out:
        out["t2d"] = t2d_from_d2t(out["d2t"], vocab)
    return out


def eagle3_feature_layers(config: dict[str, Any]) -> list[int] | None:
    """Our feature layers (indices into HF ``hidden_states``: the input of layer i) from an EAGLE-3 config.

    vLLM reads a top-level ``eagle_aux_hidden_state_layer_ids`` as layer inputs (same as ours);
    SGLang/ModelOpt's ``eagle_config.eagle_aux_hidden_state_layer_ids`` name layer *outputs*
    (SGLang captures ``id + 1``). None: the EAGLE-3 default, inputs of 2, L//2, L-3.
    """
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return [int(i) for i in ids]
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        return [int(i) + 1 for i in nested]
    return None


def eagle3_norm_flags(config: dict[str, Any]) -> dict[str, bool]:
    """The EAGLE-3 norm variants a config turns on, where vLLM reads them: the top level, or
    ``eagle_config`` for ``norm_before_fc``."""
    nested = config.get("eagle_config") or {}
    flags = {f: bool(config.get(f, nested.get(f))) for f in EAGLE3_FLAGS}
    return {f: True for f, on in flags.items() if on}


def default_input_norm(tensors: dict[str, torch.Tensor], flags: dict[str, bool], where: str) -> None:
    """A speculators EAGLE-3 (or P-EAGLE) with ``norm_before_fc`` but no ``input_norm.weight``:
    speculators lists that key as optional on load and leaves the norm at its initial weight (ones),
    so the import does too, and says so in one line on stderr."""
    if not flags.get("norm_before_fc") or "input_norm.weight" in tensors or "fc.weight" not in tensors:
        return
    width = tensors["fc.weight"].shape[1]
    tensors["input_norm.weight"] = torch.ones(width, dtype=tensors["fc.weight"].dtype)
    print(
        f"note: {where} sets norm_before_fc but holds no input_norm.weight; loaded as speculators loads "
        "it, with the norm's initial weight (ones)",
        file=sys.stderr,
    )


def eagle_layers(target: nn.Module, official: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The drafter's constructor arguments for its layers: the target's config, and the Llama
    layers sized from it with the published drafter's own sizes and rope applied (vLLM builds
    the drafter from that config, so the import computes as vLLM serves it)."""
    target_config = target.config.to_dict()
    return {
        "target_config": target_config,
        "layer_config": llama_layers(target_config, num_layers, given=own_sizes(official)),
    }


def build_eagle(
    ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE layouts -> (``"eagle"``, EagleDrafter arguments, tensors under our names)."""
    sd = read_tensors(ckpt.files)
    check_embedding(sd, target, ckpt.where())
    if ckpt.layout == "eagle-1":
        n = len({k.split(".")[1] for k in sd if k.startswith("layers.")})
        spec = {**eagle_layers(target, ckpt.config, n), "version": 1, "num_decoder_layers": n}
        spec["fc_bias"] = "fc.bias" in sd
        return "eagle", spec, eagle1_tensors(sd)
    target_hidden = ckpt.config.get("target_hidden_size")
    if target_hidden is not None and target_hidden != ckpt.config.get("hidden_size", fp.hidden_size):
        raise UserError(
            f"{ckpt.where()}: a draft hidden size different from the target's ({target_hidden}) is not supported"
        )
    lm = sd.get("lm_head.weight")
    if ckpt.origin == "speculators" and lm is not None and lm.shape[0] == fp.vocab_size:
        sd.setdefault("d2t", torch.zeros(fp.vocab_size, dtype=torch.long))  # a full vocabulary has no maps
    if lm is None or "d2t" not in sd:
        raise UserError(
            f"{ckpt.where()}: an EAGLE-3 checkpoint needs lm_head.weight and d2t; it is incomplete"
        )
    spec = {
        **eagle_layers(target, ckpt.config, 1),
        "version": 3,
        "num_decoder_layers": 1,
        "feature_layers": eagle3_feature_layers(ckpt.config),
        "draft_vocab_size": int(lm.shape[0]),
        **eagle3_norm_flags(ckpt.config),
    }
    tensors = eagle3_tensors(sd, fp.vocab_size)
    if ckpt.origin == "speculators":
        default_input_norm(tensors, spec, ckpt.where())
    check_vocab_maps(tensors["d2t"], tensors["t2d"], fp.vocab_size, ckpt.where())
    return "eagle", spec, tensors
