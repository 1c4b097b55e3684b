"""Import DFlash checkpoints: z-lab's ``DFlashDraftModel`` and the vLLM/SGLang DFlash exports.

The tensor names are ours (an optional ``model.`` prefix aside); the config is a Qwen3 config
whose shape keys build the drafter's layers, with ``dflash_config.mask_token_id``,
``dflash_config.target_layer_ids`` (layer *outputs*: our ``feature_layers`` are those plus one),
``block_size`` (top level or in ``dflash_config``) and ``num_target_layers``. A checkpoint for
another target (hidden size, vocabulary, depth, layer ids, mask token), a block size below 2,
sliding-window or causal layers are refused in one line, before any tensor is read. A reduced
vocabulary comes as vLLM reads it: ``lm_head`` [Vd, H] and ``d2t``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds.dflash import LAYER_KEYS, dflash_layers_problem
from draftheads.heads.convert.target_copies import check_embedding, check_shared_rows
from draftheads.heads.layouts import OfficialCheckpoint, read_tensors
from draftheads.heads.reduced_vocab import check_vocab_maps, t2d_from_d2t
from draftheads.heads.target.fingerprint import TargetFingerprint

# Keys of a DFlash checkpoint's Qwen3 config that shape the drafter's layers (DFlashDrafter's layer_config).
DFLASH_LAYER_KEYS = tuple(k for k in LAYER_KEYS if k != "rope_parameters")  # rope is read apart


def is_int(value: Any) -> bool:
    """An integer that is not a bool (JSON ``true`` would pass ``isinstance(v, int)``)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class DFlashKeys:
    """How a checkpoint's own config names the mask token and the target layers, so that a refusal
    quotes the file: ``offset`` turns z-lab's ids (layer outputs) into the file's."""

    mask: str
    layers: str
    offset: int

    def ids(self, ids: Any) -> Any:
        """z-lab's ``ids`` as the file writes them."""
        return [i + self.offset if is_int(i) else i for i in ids] if isinstance(ids, list) else ids


ZLAB_KEYS = DFlashKeys("dflash_config.mask_token_id", "dflash_config.target_layer_ids", 0)
# a speculators dflash config: the mask at the top level, the layers as inputs (ours)
SPECULATORS_KEYS = DFlashKeys("mask_token_id", "aux_hidden_state_layer_ids", 1)


def zlab_default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's ``target_layer_ids`` when a config lists none: the middle layer for a one-layer
    drafter, else ``num_draft_layers`` ids spread evenly over layers 1..L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, span = 1, num_target_layers - 4
    return [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def dflash_setting(config: dict[str, Any], key: str) -> Any:
    """A DFlash setting from ``dflash_config``, else from the top level (``block_size`` lives in
    either, depending on the checkpoint's age)."""
    nested = config.get("dflash_config") or {}
    return nested[key] if key in nested else config.get(key)


def check_dflash_target(config: dict[str, Any], fp: TargetFingerprint, where: str) -> None:
    """A DFlash config's hidden size, vocabulary and target depth must be the target's."""
    for key, own, what in (
        ("hidden_size", fp.hidden_size, "hidden size"),
        ("vocab_size", fp.vocab_size, "vocabulary size"),
        ("num_target_layers", fp.num_layers, "layer count"),
    ):
        value = dflash_setting(config, key)
        if value is not None and value != own:
            raise UserError(
                f"{where}: it was trained for a target with {what} {value}, but {fp.short()} has {own}; "
                "load it with the target it was trained for"
            )


def dflash_layers_from_config(
    config: dict[str, Any],
    num_draft_layers: int,
    fp: TargetFingerprint,
    where: str,
    keys: DFlashKeys = ZLAB_KEYS,
) -> list[int]:
    """Our ``feature_layers`` from ``dflash_config.target_layer_ids`` (layer outputs: ours are
    those plus one), z-lab's default when absent; refused when the target cannot supply them,
    naming the ids as the file's config does (``keys``)."""
    ids = dflash_setting(config, "target_layer_ids")
    if ids is None:
        ids = zlab_default_layer_ids(fp.num_layers, num_draft_layers)
    if not isinstance(ids, list) or not ids or not all(is_int(i) for i in ids):
        raise UserError(f"{where}: {keys.layers}={keys.ids(ids)!r} must be a non-empty list of layer ids")
    last = fp.num_layers - 2
    if min(ids) < 0 or max(ids) > last:
        raise UserError(
            f"{where}: {keys.layers}={keys.ids(ids)} reach outside {keys.offset}..{last + keys.offset}, the "
            f"layers that draftheads and the engines feed from {fp.short()}; the file is damaged, or was "
            "written for a deeper target (or reads the final normed state, which no engine captures)"
        )
    layers = [i + 1 for i in ids]
    problem = dflash_layers_problem(layers, fp.num_layers)
    if problem:
        raise UserError(f"{where}: {keys.layers}={keys.ids(ids)}: {problem.split(': ', 1)[1]}")
    return layers


def dflash_block_size(config: dict[str, Any], where: str) -> int:
    """``block_size``: an integer of at least 2 (the last accepted token and one drafted token)."""
    block = dflash_setting(config, "block_size")
    if not is_int(block) or block < 2:
        raise UserError(
            f"{where}: block_size={block!r} must be an integer of at least 2 (the last accepted token and "
            "at least one drafted token); set the block size the drafter was trained with in config.json"
        )
    return block


def dflash_mask_token(
    config: dict[str, Any], fp: TargetFingerprint, where: str, keys: DFlashKeys = ZLAB_KEYS
) -> int:
    """``dflash_config.mask_token_id``: a token id of the target's vocabulary."""
    mask = dflash_setting(config, "mask_token_id")
    if mask is None:
        raise UserError(
            f"{where}: config.json names no {keys.mask}; add the mask token id the drafter was trained with"
        )
    if not is_int(mask) or not 0 <= mask < fp.vocab_size:
        raise UserError(
            f"{where}: {keys.mask}={mask!r} is not a token id of {fp.short()} "
            f"(0..{fp.vocab_size - 1}); it was trained for another target"
        )
    return mask


def dflash_layer_config(config: dict[str, Any], where: str) -> tuple[int, dict[str, Any]]:
    """(number of layers, our ``layer_config``) from the checkpoint's Qwen3 config, read as z-lab's
    model reads it (``Qwen3Config`` defaults, ``rope_theta``/``rope_scaling`` or ``rope_parameters``).

    Sliding-window layers (causal in the engines) and ``dflash_config.causal`` are refused: this
    drafter attends to the whole context and the whole block in every layer.
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import Qwen3Config

    if (config.get("dflash_config") or {}).get("causal"):
        raise UserError(
            f"{where}: dflash_config.causal=true (a causal-in-block variant) is not supported; draftheads "
            "drafts each block non-causally"
        )
    keys = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
    try:
        qc = Qwen3Config.from_dict(keys)
    except (ValueError, TypeError, StrictDataclassError) as e:
        detail = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        raise UserError(
            f"{where}: config.json is not a valid Qwen3 config ({detail[-1]}); it is damaged"
        ) from None
    if "sliding_attention" in (qc.layer_types or []):
        raise UserError(
            f"{where}: layer_types has sliding_attention layers; draftheads' DFlash drafter attends to the "
            "whole context in every layer, so this checkpoint cannot be loaded"
        )
    shape = {k: getattr(qc, k) for k in DFLASH_LAYER_KEYS}
    shape["rope_parameters"] = dict(qc.rope_parameters or {})
    return int(qc.num_hidden_layers), json.loads(json.dumps(shape))


def dflash_tensors(
    sd: dict[str, torch.Tensor], target: nn.Module, fp: TargetFingerprint, where: str
) -> tuple[dict[str, torch.Tensor], int]:
    """DFlash keys -> ours, and the draft vocabulary size.

    A ``model.`` prefix and rotary caches are dropped; an embedding copy or an lm_head must be the
    target's (checked, then dropped: both are shared). A reduced vocabulary comes as vLLM reads it:
    ``d2t`` with ``lm_head`` [Vd, H] (the target's rows ``i + d2t[i]``); ``t2d`` is rebuilt if absent.
    """
    out = {
        (k[len("model.") :] if k.startswith("model.") else k): v
        for k, v in sd.items()
        if not k.endswith("rotary_emb.inv_freq")
    }
    check_embedding(out, target, where)
    out.pop("embed_tokens.weight", None)
    head = out.pop("lm_head.weight", None)
    V = fp.vocab_size
    if "d2t" not in out:
        if head is not None:
            check_shared_rows(head, target, torch.arange(V), where)
        out["d2t"], out["t2d"] = torch.zeros(V, dtype=torch.long), torch.ones(V, dtype=torch.bool)
        return out, V
    out["d2t"] = out["d2t"].long()
    out.setdefault("t2d", t2d_from_d2t(out["d2t"], V))
    check_vocab_maps(out["d2t"], out["t2d"], V, where)
    if head is None:
        raise UserError(
            f"{where}: it has a reduced draft vocabulary (d2t) but no lm_head.weight for it; the checkpoint is incomplete"
        )
    check_shared_rows(head, target, torch.arange(out["d2t"].numel()) + out["d2t"], where)
    return out, int(out["d2t"].numel())


def build_dflash(
    ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """z-lab's DFlash layout (or a vLLM/SGLang DFlash export) -> (``"dflash"``, DFlashDrafter arguments, tensors).

    Every config value is checked against the target before any tensor is read.
    """
    where, config = ckpt.where(), ckpt.config
    keys = SPECULATORS_KEYS if ckpt.origin == "speculators" else ZLAB_KEYS
    check_dflash_target(config, fp, where)
    block = dflash_block_size(config, where)
    mask = dflash_mask_token(config, fp, where, keys)
    num_layers, layer_cfg = dflash_layer_config(config, where)
    layers = dflash_layers_from_config(config, num_layers, fp, where, keys)
    tensors, draft_vocab = dflash_tensors(read_tensors(ckpt.files), target, fp, where)
    spec = {
        "target_config": target.config.to_dict(),
        "mask_token_id": mask,
        "block_size": block,
        "num_decoder_layers": num_layers,
        "feature_layers": layers,
        "draft_vocab_size": draft_vocab,
        "layer_config": layer_cfg,
    }
    return "dflash", spec, tensors
