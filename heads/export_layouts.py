"""The engines' layouts of each drafter kind: a config and tensors as vLLM or SGLang load them.

:mod:`draftheads.heads.export` writes and validates them; what each engine's loader reads is in
:mod:`draftheads.heads.engines`. Conventions (layer ids, DFlash's z-lab layout, a reduced
vocabulary) are described in :mod:`draftheads.heads.export`'s docstring.
"""

from __future__ import annotations

from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.layers import feature_layers_problem
from draftheads.heads.base import Drafter
from draftheads.heads.card import sglang_refusal
from draftheads.heads.layouts import DFLASH_ARCHITECTURE

LLAMA_LAYER_TYPES = ("llama", "mistral")  # decoder layers the engines' Llama EAGLE drafters can load


# ---- conversion -------------------------------------------------------------------------------
def llama_config(drafter: Drafter, architectures: list[str]) -> dict[str, Any]:
    """An HF Llama config for an EAGLE drafter's layers (what the engines' Llama drafters read)."""
    lc = drafter.layer_config
    if (
        lc.model_type not in LLAMA_LAYER_TYPES
        or getattr(lc, "attention_bias", False)
        or getattr(lc, "mlp_bias", False)
    ):
        raise UserError(
            f"the drafter's layers are {lc.model_type} decoder layers; vLLM and SGLang load EAGLE drafters as "
            "Llama layers, so only drafters for Llama/Mistral-style targets (no attention/MLP bias) can be exported"
        )
    tc = drafter.target_config
    rope = dict(getattr(lc, "rope_parameters", None) or {})
    fp = drafter.target_fingerprint
    cfg = {
        "architectures": architectures,
        "model_type": "llama",
        "hidden_size": fp.hidden_size,
        "intermediate_size": lc.intermediate_size,
        "num_attention_heads": lc.num_attention_heads,
        "num_key_value_heads": lc.num_key_value_heads,
        "head_dim": getattr(lc, "head_dim", None) or fp.hidden_size // lc.num_attention_heads,
        "num_hidden_layers": drafter.num_decoder_layers,
        "vocab_size": fp.vocab_size,
        "rms_norm_eps": lc.rms_norm_eps,
        "hidden_act": lc.hidden_act,
        "max_position_embeddings": lc.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", getattr(lc, "rope_theta", 10000.0)),
        "rope_parameters": rope or None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": tc.get("bos_token_id"),
        "eos_token_id": tc.get("eos_token_id"),
        "pad_token_id": tc.get("pad_token_id"),
        "torch_dtype": str(drafter.fc.weight.dtype).replace("torch.", ""),
    }
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return cfg


def export_eagle1(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE-1: our names are the official ones. vLLM builds fc without a bias: a nonzero one is
    refused; SGLang builds it with one: a bias-less drafter gets an exact zero bias."""
    fp = drafter.target_fingerprint
    if drafter.feature_layers() != [fp.num_layers]:
        raise UserError(
            f"this EAGLE-1 drafter reads target layer {drafter.feature_layers()}; the engines feed it the "
            f"final normed hidden state (layer {fp.num_layers}) only"
        )
    sd = {k: v for k, v in drafter.state_to_save().items() if k != "embed_tokens.weight"}
    if engine == "vllm":
        bias = sd.pop("fc.bias", None)
        if bias is not None and bool(bias.ne(0).any()):
            raise UserError(
                f"vLLM builds the EAGLE fc layer without a bias and silently drops fc.bias, but this drafter's "
                f"bias is nonzero (max |b| = {bias.abs().max().item():.3g}); serve it with format=sglang, "
                "or retrain it with draft.fc_bias=false"
            )
        return llama_config(drafter, ["LlamaForCausalLM"]), sd
    if "fc.bias" not in sd:
        sd["fc.bias"] = torch.zeros(fp.hidden_size, dtype=sd["fc.weight"].dtype)
    return llama_config(drafter, ["LlamaForCausalLMEagle"]), sd


def export_eagle3(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE-3: ``layers.0.*`` -> ``midlayer.*``, ``hidden_norm`` -> ``midlayer.hidden_norm``; aux layer ids per engine."""
    fp = drafter.target_fingerprint
    if drafter.num_decoder_layers != 1:
        raise UserError(
            f"the engines' EAGLE-3 drafters have one layer; this one has {drafter.num_decoder_layers}"
        )
    layers = drafter.feature_layers()
    problem = feature_layers_problem(layers, 3, fp.num_layers, last=fp.num_layers - 1)
    if problem:
        raise UserError(
            f"{problem}; the engines capture layer inputs 1..{fp.num_layers - 1} only, so layer "
            f"{fp.num_layers} (the final normed state) and layer 0 cannot be served"
        )
    sd: dict[str, torch.Tensor] = {}
    for k, v in drafter.state_to_save().items():
        if k == "embed_tokens.weight":
            continue
        if k == "hidden_norm.weight":
            k = "midlayer.hidden_norm.weight"
        elif k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0.") :]
        sd[k] = v
    sd["d2t"], sd["t2d"] = sd["d2t"].to(torch.int64), sd["t2d"].to(torch.bool)
    cfg = llama_config(drafter, ["LlamaForCausalLMEagle3"])
    cfg.update(draft_vocab_size=drafter.draft_vocab_size, target_hidden_size=fp.hidden_size)
    if engine == "vllm":
        cfg.update(eagle_aux_hidden_state_layer_ids=layers, **drafter.norm_flags)
    else:
        sglang_norm_refusal(drafter.norm_flags)
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers],
            "use_aux_hidden_state": True,
        }
    return cfg, sd


def sglang_norm_refusal(flags: dict[str, bool]) -> None:
    """SGLang's EAGLE-3 loader was read for none of the norm variants: refuse a drafter with one."""
    on = [k for k, v in flags.items() if v]
    if on:
        raise UserError(
            f"this EAGLE-3 drafter uses {', '.join(on)}, which SGLang's EAGLE-3 loader is not known to read; "
            "export it with format=vllm or format=speculators"
        )


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
