"""The shape of a drafter's own decoder layers, read from any target's config.

The engines serve a drafter's layers as one architecture whatever the target: vLLM, SGLang and
speculators build a kind's drafter from one layer class (Llama layers, or Qwen3-style ones; the
kind's model says which) for every target (Qwen3, Llama-4, GPT-OSS, DeepSeek, ...). Only the
target's hidden states, embedding and head enter a drafter. So the drafter's layers take their
sizes from the target's config, as speculators derives them, and nothing else of it:

* hidden size, vocabulary, query and key/value heads and head size; a head size whose heads do
  not tile the hidden size (DeepSeek-V3's MLA rope part, ``head_dim`` of a latent attention) is
  replaced by ``hidden // heads``;
* the MLP width: the target's ``intermediate_size``, or when it names none 3 x hidden for a
  mixture of experts (speculators' rule) and 4 x hidden otherwise (GPT-2's);
* rope θ and scaling; a per-layer-kind rope (Gemma-3/4) gives its sliding layers' (as
  speculators does), a partial rotary factor is dropped (the drafter rotates whole heads);
* the norm epsilon and the context length. The activation is SiLU: vLLM's Llama MLP takes no other.

A published drafter may also bring a sliding window (speculators' trainer writes ``sliding_window``,
``use_sliding_window`` and ``layer_types``): the layers whose ``layer_types`` entry is
``sliding_attention`` see only the keys less than ``sliding_window`` positions back, as vLLM and
speculators apply it (:func:`window_settings`, :func:`window_mask`). The target's own window is not
the drafter's: a drafter sized from a target attends fully unless its checkpoint says otherwise.

GPT-2-style names (``n_embd``, ``n_head``, ``n_inner``, ...) are read as their Llama twins, and a
multimodal config's ``text_config`` stands for the whole. A field the drafter cannot do without
(hidden size, heads, vocabulary) is refused in one line naming it.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.masks import kind_allowed

# Llama name -> the other names architectures use for the same size
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("n_embd", "d_model"),
    "num_attention_heads": ("n_head", "num_heads"),
    "num_hidden_layers": ("n_layer", "num_layers"),
    "intermediate_size": ("n_inner", "ffn_dim"),
    "max_position_embeddings": ("n_positions", "max_seq_len"),
    "rms_norm_eps": ("layer_norm_epsilon", "layer_norm_eps", "norm_eps"),
}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
ROPE_DROPPED = ("partial_rotary_factor", "type", "mrope_interleaved")


def text_config(target_config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: a multimodal config's ``text_config``, else the config itself."""
    inner = target_config.get("text_config")
    return (
        {**inner, "model_type": inner.get("model_type", target_config.get("model_type"))}
        if isinstance(inner, dict)
        else dict(target_config)
    )


def read(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """``config[key]`` under its Llama name or any alias; ``default`` when none is set."""
    for name in (key, *ALIASES.get(key, ())):
        if config.get(name) is not None:
            return config[name]
    return default


def required(config: dict[str, Any], key: str) -> Any:
    value = read(config, key)
    if value is None:
        raise UserError(
            f"the target's config ({config.get('model_type', 'unknown type')}) has no {key}, which the "
            f"drafter's layers are sized by; add it to the target's config.json"
        )
    return value


def rope(config: dict[str, Any]) -> dict[str, Any]:
    """The target's rope θ and scaling as one flat ``rope_parameters`` dict (module docstring)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(params, dict) and "rope_theta" not in params and "rope_type" not in params:
        params = params.get("sliding_attention") or params.get("full_attention") or {}
    out = {k: v for k, v in dict(params).items() if k not in ROPE_DROPPED}
    out.setdefault("rope_type", out.pop("type", None) or "default")
    out.setdefault("rope_theta", float(config.get("rope_theta") or 10000.0))
    return out


def attention_shape(config: dict[str, Any], hidden: int) -> tuple[int, int, int]:
    """(query heads, key/value heads, head size) for a Llama attention of width ``hidden``."""
    heads = int(required(config, "num_attention_heads"))
    kv = int(config.get("num_key_value_heads") or config.get("multi_query_group_num") or heads)
    head_dim = config.get("head_dim")
    if config.get("kv_lora_rank") or not head_dim:  # latent attention: its head_dim is the rope part
        head_dim = hidden // heads
    if heads % kv:
        kv = heads
    return heads, kv, int(head_dim)


def llama_layers(
    target_config: dict[str, Any], num_layers: int, given: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``LlamaConfig`` arguments for ``num_layers`` drafter layers sized from ``target_config``
    (module docstring); ``given`` (an imported checkpoint's own sizes) takes precedence.
    JSON-plain, so it is exactly what a ``config.json`` holds."""
    c = text_config(target_config)
    hidden = int(required(c, "hidden_size"))
    heads, kv, head_dim = attention_shape(c, hidden)
    dense = read(c, "intermediate_size")
    moe = any(c.get(k) for k in MOE_KEYS)
    out: dict[str, Any] = {
        "vocab_size": int(required(c, "vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(dense) if dense else (3 if moe else 4) * hidden,
        "num_hidden_layers": int(num_layers),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(read(c, "max_position_embeddings", 8192)),
        "rms_norm_eps": float(read(c, "rms_norm_eps", 1e-6)),
        "rope_parameters": rope(c),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if c.get(key) is not None:
            out[key] = c[key]
    out.update({k: v for k, v in (given or {}).items() if v is not None})
    out["num_hidden_layers"] = int(num_layers)
    return json.loads(json.dumps(out))


# the keys of a published drafter's config that size its own layers (beside the target's width)
OWN_KEYS = (
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "hidden_act",
    "max_position_embeddings",
)


def own_sizes(config: dict[str, Any]) -> dict[str, Any]:
    """A published drafter's own layer sizes and rope (its official config, a speculators
    ``transformer_layer_config``), as :func:`llama_layers` takes them in ``given``."""
    out = {k: config[k] for k in OWN_KEYS if config.get(k) is not None}
    if any(config.get(k) is not None for k in ("rope_parameters", "rope_scaling", "rope_theta")):
        out["rope_parameters"] = rope(config)
    return {**out, **window_settings(config)}


# ---- a published drafter's sliding window ----------------------------------------------------------
WINDOW_KEYS = ("sliding_window", "use_sliding_window", "layer_types")
LAYER_KINDS = ("full_attention", "sliding_attention")  # what the drafter's Llama layers run


def window_settings(config: dict[str, Any]) -> dict[str, Any]:
    """A published drafter's sliding window, as its layers' config states it: ``sliding_window``
    and ``layer_types`` with ``use_sliding_window`` (what speculators' trainer writes); empty when no
    layer slides. A layer slides when its ``layer_types`` entry is ``sliding_attention`` and a
    window is set, as vLLM's Llama layer and speculators' model read it (``use_sliding_window``
    alone turns on nothing there, so not here either)."""
    kinds, size = config.get("layer_types") or [], config.get("sliding_window")
    if "sliding_attention" not in kinds or not size:
        return {}
    return {"sliding_window": int(size), "use_sliding_window": True, "layer_types": list(kinds)}


def check_window(layer_config: dict[str, Any], num_layers: int) -> None:
    """Refuse, in one line, ``layer_types`` that a drafter of ``num_layers`` Llama layers cannot
    run: another number of entries, or a kind other than full or sliding attention."""
    kinds = layer_config.get("layer_types")
    if not kinds:
        return
    if len(kinds) != num_layers:
        raise UserError(
            f"the drafter's layer config has layer_types={list(kinds)} ({len(kinds)} entries) for "
            f"num_hidden_layers={num_layers}; give one entry per decoder layer"
        )
    odd = [k for k in kinds if k not in LAYER_KINDS]
    if odd:
        raise UserError(
            f"the drafter's layer_types holds {odd[0]!r}; its Llama layers run {' or '.join(LAYER_KINDS)}"
        )


def sliding_layers(layer_config: Any) -> list[int]:
    """The indices of the drafter's layers that slide (``layer_config``: a ``LlamaConfig``)."""
    kinds = getattr(layer_config, "layer_types", None) or []
    if not getattr(layer_config, "sliding_window", None):
        return []
    return [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]


def window_mask(
    layer_config: Any, mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """``mask`` (additive or boolean ``[B, 1, q, k]``) narrowed to a sliding layer's window by
    token position (``q_pos [B, q]``, ``k_pos [B, k]``): a key p is seen from q when
    ``q - p < sliding_window``, the target side's rule (:func:`~draftheads.heads.masks.kind_allowed`)."""
    B, q, k = q_pos.shape[0], q_pos.shape[1], k_pos.shape[1]
    every = torch.ones(B, q, k, dtype=torch.bool, device=mask.device)
    ok = kind_allowed(layer_config, "sliding_attention", every, q_pos.to(mask.device), k_pos.to(mask.device))
    if mask.dtype == torch.bool:
        return mask & ok[:, None]
    return torch.where(ok[:, None], mask, torch.finfo(mask.dtype).min)
