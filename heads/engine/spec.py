"""The vocabulary of the engine loader specs: tensor and config expectations, loader rules, Llama layers.

Each kind's ``heads/<kind>/engine.py`` writes what vLLM's and SGLang's loaders read in these
terms, and :mod:`draftheads.heads.engine.loaders` checks an export against them. The Llama decoder
layer's tensors live here because the drafters of more than one kind build on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorRule:
    """One expected tensor: its shape, whether the loader needs it, and its dtype family."""

    shape: Shape
    required: bool = True
    dtype: str = "float"  # "float", "int64" or "bool"


@dataclass(frozen=True)
class EngineFormat:
    """What one engine loader reads: config fields (with fixed values where it insists) and tensors."""

    engine: str
    method: str  # vLLM ``speculative_config.method`` / SGLang ``--speculative-algorithm``
    architectures: list[str] | None  # exact value required in config.json
    model_type: str
    config_fields: tuple[str, ...]
    tensors: Callable[[dict[str, Any]], dict[str, TensorRule]]
    forbidden_config: tuple[str, ...] = ()
    # flags the engine's serve command needs beside the drafter, ``{block}`` the drafted tokens
    # plus the root (e.g. a block drafter's attention backend in vLLM, its block size in SGLang)
    serve_flags: str = ""


@dataclass(frozen=True)
class Rule:
    """A loader rule beyond names and shapes: what it demands, where, and the check that enforces it.

    ``check(config, target_layers)`` returns the problem as a message, or None. ``target_layers``
    is the target's depth when the exporter knows it (range checks need it).
    """

    name: str
    methods: tuple[tuple[str, str], ...]  # (engine, method) pairs it applies to
    demands: str
    sources: tuple[str, ...]  # engine files, relative to vllm/ or sglang/srt/
    check: Callable[[dict[str, Any], int | None], str | None]


def head_dim(c: dict[str, Any]) -> int:
    """The attention head size a config declares, or hidden size over head count."""
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def llama_layer_rules(prefix: str, c: dict[str, Any], qkv_in: int, input_norm: bool) -> dict[str, TensorRule]:
    """A Llama decoder layer's tensors (vLLM/SGLang fuse q/k/v and gate/up on load, from these names)."""
    H, hd, inter = c["hidden_size"], head_dim(c), c["intermediate_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    rules = {
        f"{prefix}self_attn.q_proj.weight": TensorRule((nh * hd, qkv_in)),
        f"{prefix}self_attn.k_proj.weight": TensorRule((nkv * hd, qkv_in)),
        f"{prefix}self_attn.v_proj.weight": TensorRule((nkv * hd, qkv_in)),
        f"{prefix}self_attn.o_proj.weight": TensorRule((H, nh * hd)),
        f"{prefix}mlp.gate_proj.weight": TensorRule((inter, H)),
        f"{prefix}mlp.up_proj.weight": TensorRule((inter, H)),
        f"{prefix}mlp.down_proj.weight": TensorRule((H, inter)),
        f"{prefix}post_attention_layernorm.weight": TensorRule((H,)),
    }
    if input_norm:
        rules[f"{prefix}input_layernorm.weight"] = TensorRule((H,))
    return rules


LLAMA_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "vocab_size",
    "rms_norm_eps",
    "hidden_act",
    "max_position_embeddings",
)
