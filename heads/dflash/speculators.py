"""DFlash in speculators' ``dflash`` layout: z-lab's (vLLM's) DFlash layout under speculators' config, both ways.

The tensor names are z-lab's in both; speculators' config counts the target layers it reads from
one (the embedding is layer 0) and nests the layer's settings in ``transformer_layer_config``.
"""

from __future__ import annotations

from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.reduced_vocab import t2d_from_d2t
from draftheads.heads.speculators import SPECULATORS_VERSION, layer_config


def dflash_to_speculators(
    engine_cfg: dict[str, Any], sd: dict[str, torch.Tensor], section: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """vLLM's DFlash layout (z-lab's names) -> speculators' ``DFlashDraftModel``.

    The tensor names are the same; a reduced vocabulary adds ``t2d`` beside ``d2t`` and the
    lm_head rows (the model class holds both maps as buffers).
    """
    vocab = engine_cfg["vocab_size"]
    draft_vocab = engine_cfg.get("draft_vocab_size") or vocab
    tensors = dict(sd)
    if "d2t" in tensors:
        tensors["t2d"] = t2d_from_d2t(tensors["d2t"], vocab)
    nested = engine_cfg["dflash_config"]
    cfg = {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_config(engine_cfg),
        "draft_vocab_size": draft_vocab,
        "block_size": engine_cfg["block_size"],
        "target_hidden_size": engine_cfg["hidden_size"],
        "aux_hidden_state_layer_ids": [i + 1 for i in nested["target_layer_ids"]],
        "mask_token_id": nested["mask_token_id"],
        # every layer is full attention, which speculators always runs both ways; vLLM reads
        # false here as dflash_config.causal for every layer, so true keeps it non-causal there too
        "sliding_window_non_causal": True,
        "sample_from_anchor": False,
        "speculators_config": section,
    }
    return cfg, tensors


def dflash_engine_config(config: dict[str, Any], layers: dict[str, Any], where: str) -> dict[str, Any]:
    """A dflash speculators config as z-lab's config (``target_layer_ids`` = our ids minus one)."""
    if config.get("sample_from_anchor"):
        raise UserError(
            f"{where}: sample_from_anchor=true (every block row predicts); draftheads' DFlash drafter, like "
            "z-lab's, predicts from the mask rows only, so this speculator cannot be loaded"
        )
    ids = config.get("aux_hidden_state_layer_ids")
    if not isinstance(ids, list) or not ids:
        raise UserError(
            f"{where}: aux_hidden_state_layer_ids={ids!r}; a dflash speculator must list the target layers "
            "its fc reads"
        )
    return {
        **layers,
        "architectures": ["DFlashDraftModel"],
        "block_size": config.get("block_size"),
        "draft_vocab_size": config.get("draft_vocab_size"),
        "dflash_config": {
            "mask_token_id": config.get("mask_token_id"),
            "target_layer_ids": [i - 1 if isinstance(i, int) else i for i in ids],
        },
    }
