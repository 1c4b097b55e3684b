"""DFlash in z-lab's layout, which vLLM and SGLang both load as ``DFlashDraftModel``.

A Qwen3 config with ``dflash_config.mask_token_id`` and ``dflash_config.target_layer_ids`` (our
``feature_layers - 1``: both engines read layer outputs), ``block_size`` and ``num_target_layers``;
our tensor names without a ``model.`` prefix, and neither the embedding nor the lm_head. A reduced
draft vocabulary is written as vLLM reads it (``draft_vocab_size``, ``lm_head`` [Vd, H] from the
target's rows, ``d2t``); SGLang cannot read one, so that export is refused (:func:`sglang_refusal`).
"""

from __future__ import annotations

from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.base import Drafter
from draftheads.heads.dflash.layout import DFLASH_ARCHITECTURE


def sglang_refusal(conf: dict[str, Any]) -> str | None:
    """Why SGLang cannot serve the DFlash drafter with config ``conf`` (a reduced vocabulary), or None."""
    vocab = conf["spec"].get("draft_vocab_size")
    if vocab is not None and vocab != conf["target"]["vocab_size"]:
        return (
            f"SGLang's DFlash drafts with the target's full lm_head and cannot read this drafter's reduced "
            f"vocabulary ({vocab} tokens, d2t); export it with format=vllm, or retrain it with "
            "draft.dflash.draft_vocab_size=null"
        )
    return None


def dflash_config(drafter: Drafter) -> dict[str, Any]:
    """The Qwen3 config both engines' ``DFlashDraftModel`` loaders read, for ``drafter``'s layers.

    ``rope_theta`` is always written, so no loader falls back to a default of its own.
    """
    fp, shape, n = drafter.target_fingerprint, drafter.layer_shape, drafter.num_decoder_layers
    rope = dict(shape["rope_parameters"])
    tc = drafter.target_config
    cfg = {
        "architectures": [DFLASH_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": fp.hidden_size,
        "intermediate_size": shape["intermediate_size"],
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["head_dim"],
        "num_hidden_layers": n,
        "vocab_size": fp.vocab_size,
        "rms_norm_eps": shape["rms_norm_eps"],
        "hidden_act": shape["hidden_act"],
        "attention_bias": bool(shape["attention_bias"]),
        "max_position_embeddings": shape["max_position_embeddings"],
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None
        if rope.get("rope_type", "default") == "default"
        else {k: v for k, v in rope.items() if k != "rope_theta"},
        "rope_parameters": rope,
        "layer_types": ["full_attention"] * n,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "block_size": drafter.block_size,
        "num_target_layers": fp.num_layers,
        "dflash_config": {
            "mask_token_id": drafter.mask_token_id,
            "target_layer_ids": [i - 1 for i in drafter.feature_layers()],
        },
        "bos_token_id": tc.get("bos_token_id"),
        "eos_token_id": tc.get("eos_token_id"),
        "pad_token_id": tc.get("pad_token_id"),
        "torch_dtype": str(drafter.fc.weight.dtype).replace("torch.", ""),
    }
    if drafter.reduced_vocab:
        cfg["draft_vocab_size"] = drafter.draft_vocab_size
    return cfg


def export_dflash(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """DFlash: our tensor names are z-lab's; ``d2t``/``t2d`` are dropped (full vocabulary) or, for
    vLLM's reduced vocabulary, ``d2t`` is kept beside the target's lm_head rows of the draft ids."""
    act = drafter.layer_shape["hidden_act"]
    if act != "silu":
        raise UserError(
            f"this DFlash drafter's MLP uses hidden_act={act}; vLLM's and SGLang's DFlash layers are SiLU-gated "
            "only, so it cannot be served by them (use the draftheads decoder)"
        )
    sd = {k: v for k, v in drafter.state_to_save().items() if k not in ("d2t", "t2d")}
    if drafter.reduced_vocab:
        if engine != "vllm":
            raise UserError(sglang_refusal(drafter.config_dict()))
        if "lm_head" not in drafter._shared:
            raise UserError(
                "this DFlash drafter has a reduced vocabulary, whose lm_head rows vLLM needs in the file; load "
                f"the target to export it (target=... for {drafter.target_fingerprint.name})"
            )
        sd["lm_head.weight"] = drafter.head().weight.detach().to("cpu")
        sd["d2t"] = drafter.d2t.to(torch.int64)
    return dflash_config(drafter), sd
