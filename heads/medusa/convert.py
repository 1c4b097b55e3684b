"""Import official Medusa checkpoints: infer heads and layers from the keys, map them to our names.

Medusa-1 files (``medusa_lm_head.safetensors`` or ``.pt``) hold ``{h}.{l}.linear.*`` ResBlocks
and, in ``medusa-v1``, a per-head lm_head ``{h}.{L}.weight``. Medusa-2 heads sit under
``medusa_head.`` in a full checkpoint of the backbone they were trained jointly with, so the
target must be that backbone, compared tensor by tensor. Head and layer counts come from the
keys, never from the config (Medusa's config gets the head count wrong).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.layouts import OfficialCheckpoint, iter_tensors, read_tensors
from draftheads.heads.medusa.layout import MEDUSA2_PREFIX, MEDUSA_KEY
from draftheads.heads.target.fingerprint import TargetFingerprint

log = logging.getLogger(__name__)


def medusa_spec(keys: list[str], where: str) -> tuple[int, int, str]:
    """(num_heads, num_layers, lm_head mode) inferred from Medusa-1 keys; strict about stray keys."""
    blocks: dict[int, set[int]] = {}
    heads_with_lm: dict[int, int] = {}
    for k in keys:
        m = MEDUSA_KEY.match(k)
        if m is None:
            raise UserError(f"{where}: unexpected key {k!r}; not a Medusa head checkpoint")
        h, i, linear, what = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        if linear:
            blocks.setdefault(h, set()).add(i)
        elif what == "weight":
            heads_with_lm[h] = i
        else:
            raise UserError(f"{where}: unexpected key {k!r}; Medusa lm_heads have no bias")
    heads = sorted(set(blocks) | set(heads_with_lm))
    if not heads or heads != list(range(len(heads))):
        raise UserError(f"{where}: head indices {heads} are not 0..n-1; the checkpoint is incomplete")
    layer_sets = {h: sorted(blocks.get(h, set())) for h in heads}
    num_layers = len(layer_sets[0])
    if any(v != list(range(num_layers)) for v in layer_sets.values()):
        raise UserError(f"{where}: heads have different or gapped ResBlock layers {layer_sets}")
    if heads_with_lm and (
        sorted(heads_with_lm) != heads or any(i != num_layers for i in heads_with_lm.values())
    ):
        raise UserError(
            f"{where}: per-head lm_heads {heads_with_lm} do not follow the {num_layers} ResBlocks of every head"
        )
    return len(heads), num_layers, "copy" if heads_with_lm else "shared"


def medusa_tensors(sd: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Official Medusa keys -> ours: ``{h}.{l}.linear.*`` -> ``blocks.{h}.{l}.linear.*``, ``{h}.{L}`` -> ``lm_heads.{h}``."""
    out = {}
    for k, v in sd.items():
        h, i, rest = k.split(".", 2)
        if rest.startswith("linear."):
            out[f"blocks.{h}.{i}.{rest}"] = v
        else:
            out[f"lm_heads.{h}.{rest}"] = v
    return out


def check_backbone(ckpt: OfficialCheckpoint, target: nn.Module) -> int:
    """Medusa-2: the target must be the checkpoint's own fine-tuned backbone; returns tensors compared.

    Every backbone tensor present in the target is compared after casting to the target's dtype
    (what loading the target from these files does), so the original base model is refused.
    """
    own = target.state_dict()
    compared = 0
    for k, v in iter_tensors(ckpt.files, keep=lambda k: not k.startswith(MEDUSA2_PREFIX) and k in own):
        mine = own[k].detach()
        if tuple(mine.shape) != tuple(v.shape) or not torch.equal(v.to(mine.dtype), mine.to("cpu")):
            raise UserError(
                f"{ckpt.where()} holds Medusa-2 heads trained jointly with a fine-tuned backbone, and the "
                f"target differs from that backbone (first at {k}); never pair them with the original base "
                f"model: load the target from this checkpoint (target.name_or_path={ckpt.directory})"
            )
        compared += 1
    if compared == 0:
        raise UserError(
            f"{ckpt.where()}: none of its backbone tensors match the target's parameter names, so the target "
            f"cannot be the fine-tuned backbone these Medusa-2 heads need; load the target from {ckpt.directory}"
        )
    return compared


def build_medusa(
    ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """Medusa layouts -> (``"medusa"``, MedusaHeads arguments, tensors under our names)."""
    if ckpt.layout == "medusa-2":
        check_backbone(ckpt, target)
        sd = {
            k[len(MEDUSA2_PREFIX) :]: v
            for k, v in iter_tensors(ckpt.files, keep=lambda k: k.startswith(MEDUSA2_PREFIX))
        }
    else:
        sd = read_tensors(ckpt.files)
    num_heads, num_layers, lm_head = medusa_spec(list(sd), ckpt.where())
    claimed = ckpt.config.get("medusa_num_heads")
    if claimed is not None and claimed != num_heads:
        log.info(
            "%s: config says medusa_num_heads=%s, the weights hold %d heads; using %d",
            ckpt.directory,
            claimed,
            num_heads,
            num_heads,
        )
    spec = {"num_heads": num_heads, "num_layers": num_layers, "lm_head": lm_head}
    return "medusa", spec, medusa_tensors(sd, num_layers)
