"""EAGLE-1 and EAGLE-3 in the engines' layouts: an HF Llama config and tensors as vLLM or SGLang load them.

What each engine's loader reads is in :mod:`draftheads.heads.eagle.engine`. EAGLE-3 auxiliary
layers: vLLM's ``eagle_aux_hidden_state_layer_ids`` index HF ``hidden_states`` as our
``feature_layers`` do; SGLang's ``eagle_config`` names layer outputs (it captures ``id + 1``), so it
is written as ``i - 1``.
"""

from __future__ import annotations

from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds.eagle import feature_layers_problem
from draftheads.heads.base import Drafter


def llama_config(drafter: Drafter, architectures: list[str]) -> dict[str, Any]:
    """An HF Llama config for an EAGLE drafter's layers (what the engines' Llama drafters read):
    its own layer config, with rope θ and scaling also under the older keys some loaders read."""
    cfg = drafter.layer_config_dict()
    rope = dict(cfg.get("rope_parameters") or {})
    cfg.update(
        architectures=architectures,
        model_type="llama",
        num_hidden_layers=drafter.num_decoder_layers,
        rope_theta=rope.get("rope_theta", 10000.0),
        torch_dtype=str(drafter.fc.weight.dtype).replace("torch.", ""),
    )
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
                "or retrain it with draft.eagle.fc_bias=false"
            )
        return llama_config(drafter, ["LlamaForCausalLM"]), sd
    sglang_window_refusal(drafter)
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
        sglang_window_refusal(drafter)
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


def sglang_window_refusal(drafter: Drafter) -> None:
    """SGLang's Llama draft layer attends fully (its attention takes no window from the config):
    refuse a drafter whose layers slide rather than serve it otherwise than it drafts."""
    if getattr(drafter, "window_layers", None):
        raise UserError(
            f"this drafter's layers slide (sliding_window={drafter.layer_config.sliding_window}, layer_types "
            f"{drafter.layer_config.layer_types}), but SGLang's Llama draft layer attends fully; export it with "
            "format=vllm or format=speculators, which apply the window"
        )
