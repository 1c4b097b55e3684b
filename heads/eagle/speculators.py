"""EAGLE-3 in speculators' ``eagle3`` layout: vLLM's EAGLE-3 layout under speculators' names, both ways.

speculators' ``Eagle3DraftModel`` holds the tensors vLLM's EAGLE-3 loader reads, with the decoder
layer as ``layers.0`` instead of ``midlayer``, and its config nests the layer's settings in
``transformer_layer_config``. P-EAGLE's speculators layout builds on the same two functions.
"""

from __future__ import annotations

from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.speculators import EAGLE3_FLAGS, SPECULATORS_VERSION, layer_config


def eagle3_to_speculators(
    engine_cfg: dict[str, Any], sd: dict[str, torch.Tensor], section: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """vLLM's EAGLE-3 layout (``midlayer.*``) -> speculators' ``Eagle3DraftModel`` (``layers.0.*``).

    A full draft vocabulary has no ``d2t``/``t2d`` there (the model class builds none).
    """
    vocab, draft_vocab = engine_cfg["vocab_size"], engine_cfg["draft_vocab_size"]
    tensors = {
        ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in sd.items()
    }
    if draft_vocab == vocab:
        tensors = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_config(engine_cfg),
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": engine_cfg["target_hidden_size"],
        "eagle_aux_hidden_state_layer_ids": engine_cfg["eagle_aux_hidden_state_layer_ids"],
        **{f: bool(engine_cfg.get(f)) for f in EAGLE3_FLAGS},
        "embed_requires_grad": False,
        "speculators_config": section,
    }
    return cfg, tensors


def eagle3_engine_config(config: dict[str, Any], layers: dict[str, Any], where: str) -> dict[str, Any]:
    """An eagle3 speculators config as vLLM's EAGLE-3 config (layer inputs as ids, as ours; the
    norm variants as vLLM reads them, at the top level)."""
    if layers.get("num_hidden_layers", 1) != 1:
        raise UserError(
            f"{where}: this eagle3 speculator has {layers['num_hidden_layers']} decoder layers; draftheads' "
            "EAGLE-3 drafter (like the engines') has one"
        )
    return {
        **layers,
        "draft_vocab_size": config.get("draft_vocab_size"),
        "target_hidden_size": config.get("target_hidden_size"),
        "eagle_aux_hidden_state_layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
        **{f: bool(config.get(f)) for f in EAGLE3_FLAGS},
    }
