"""Medusa heads in vLLM's layout (``MedusaModel``); SGLang serves no Medusa heads."""

from __future__ import annotations

from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.base import Drafter


def export_medusa(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Medusa -> vLLM: ``blocks.{i}.{j}.linear`` -> ``blocks.{i}.layers.{j}``.

    Heads sharing the target's lm_head are written with ``original_lm_head: true`` and that
    lm_head once, as ``lm_heads.0.weight`` (vLLM shares it across heads), not a copy per head.
    """
    if engine != "vllm":
        raise UserError(
            "SGLang has no Medusa support; export Medusa heads with format=vllm, or train an EAGLE drafter for SGLang"
        )
    fp = drafter.target_fingerprint
    sd: dict[str, torch.Tensor] = {}
    for k, v in drafter.state_to_save().items():
        parts = k.split(".")
        if parts[0] == "blocks":  # blocks.{i}.{j}.linear.{weight,bias}
            sd[f"blocks.{parts[1]}.layers.{parts[2]}.{parts[4]}"] = v
        else:
            sd[k] = v
    shared = drafter.lm_head_mode == "shared"
    if shared:
        if "lm_head" not in drafter._shared:
            raise UserError(
                "these Medusa heads share the target's lm_head, which vLLM needs in the file; load the target "
                f"to export them (target=... for {fp.name})"
            )
        sd["lm_heads.0.weight"] = drafter.shared("lm_head").weight.detach().to("cpu")
    cfg = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": fp.hidden_size,
        "vocab_size": fp.vocab_size,
        "num_heads": drafter.num_heads,
        "num_hidden_layers": drafter.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": shared,
        "max_paths": 64,
        "topk": 10,
        "truncated_vocab_size": None,
    }
    return cfg, sd
