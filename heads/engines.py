"""What vLLM's and SGLang's drafter loaders read, written out once, and a checker for it.

================  ==================  ==================================  =======================================
drafter           engine              config                              tensors
================  ==================  ==================================  =======================================
EAGLE-1           vLLM ``eagle``      Llama config, ``LlamaForCausalLM``  ``fc.weight`` [H,2H] (no bias),
                                      (vLLM renames it Eagle…)            ``layers.{i}.*`` (layer 0: no input norm)
EAGLE-1           SGLang ``EAGLE``    ``LlamaForCausalLMEagle``           ``fc.weight``, ``fc.bias``, ``layers.{i}.*``
EAGLE-3           both ``eagle3``     ``LlamaForCausalLMEagle3``,         ``fc.weight`` [H,3H], ``midlayer.*`` (q/k/v
                                      ``draft_vocab_size``, aux layers    over 2H, ``hidden_norm``), ``norm``,
                                                                          ``lm_head`` [Vd,H], ``d2t``, ``t2d``
Medusa            vLLM ``medusa``     ``model_type: medusa``,             ``blocks.{i}.layers.{j}.{weight,bias}``,
                                      ``MedusaModel``                     ``lm_heads.{i}.weight`` [V,H], or one
                                                                          ``lm_heads.0.weight`` with
                                                                          ``original_lm_head: true``
DFlash            vLLM ``dflash``,    Qwen3 config, ``DFlashDraftModel``, ``layers.{i}.*`` (q/k norms), ``fc``
                  SGLang ``DFLASH``   ``dflash_config.{mask_token_id,     [H,K*H], ``hidden_norm``, ``norm``; no
                                      target_layer_ids}``, ``block_size``  embedding or lm_head (vLLM, reduced
                                      ``num_target_layers``               vocabulary: ``lm_head`` [Vd,H], ``d2t``)
================  ==================  ==================================  =======================================

:data:`FORMATS` holds each loader's config fields, tensor names, shapes and dtypes;
:data:`RULES` holds the loaders' further rules, each with the engine source file it comes from.
:func:`validate_export` checks a directory against both, strictly: the engines skip unknown keys
silently (vLLM drops ``fc.bias``), so an extra key is an error here. This is a check of names,
shapes, dtypes and these rules, not an engine load.

The DFlash rules were read from vLLM's ``model_executor/models/qwen3_dflash.py`` (commit
036a00d1), ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` (0cfdd2e1) and
``v1/worker/gpu/spec_decode/dflash/utils.py`` (055e47c2), ``dflash/speculator.py`` (00746147)
and ``spec_decode/utils.py``, and from SGLang's
``srt/models/dflash.py`` (7f151c5e, 003b23d7), ``srt/speculative/dflash_utils.py`` (00731f0b)
and ``srt/speculative/dflash_worker.py`` (7f151c5e). Both engines read ``target_layer_ids`` as
layer *outputs* (vLLM adds one to make its aux-layer ids, SGLang captures ``id + 1``): our
``feature_layers`` minus one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import dflash_layers_problem, feature_layers_problem
from draftheads.heads.checkpoint import CONFIG_NAME, WEIGHTS_NAME

ENGINES = ("vllm", "sglang")
DFLASH_METHODS = (("vllm", "dflash"), ("sglang", "DFLASH"))
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


def _head_dim(c: dict[str, Any]) -> int:
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def llama_layer_rules(prefix: str, c: dict[str, Any], qkv_in: int, input_norm: bool) -> dict[str, TensorRule]:
    """A Llama decoder layer's tensors (vLLM/SGLang fuse q/k/v and gate/up on load, from these names)."""
    H, hd, inter = c["hidden_size"], _head_dim(c), c["intermediate_size"]
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


def eagle1_rules(fc_bias: bool, optional_lm_head: bool) -> Callable[[dict[str, Any]], dict[str, TensorRule]]:
    """EAGLE-1: fc over concat(embedding, feature), then layers; layer 0 has no input norm."""

    def rules(c: dict[str, Any]) -> dict[str, TensorRule]:
        H, V = c["hidden_size"], c["vocab_size"]
        out = {"fc.weight": TensorRule((H, 2 * H)), "embed_tokens.weight": TensorRule((V, H), required=False)}
        if fc_bias:
            out["fc.bias"] = TensorRule((H,))
        if optional_lm_head:
            out["lm_head.weight"] = TensorRule((V, H), required=False)
        for i in range(c["num_hidden_layers"]):
            out.update(llama_layer_rules(f"layers.{i}.", c, H, input_norm=i > 0))
        return out

    return rules


def eagle3_rules(c: dict[str, Any]) -> dict[str, TensorRule]:
    """EAGLE-3 (both engines): one ``midlayer`` whose q/k/v read 2H, own norm, lm_head and vocab maps."""
    H, V = c["hidden_size"], c["vocab_size"]
    Vd, Ht = c["draft_vocab_size"], c.get("target_hidden_size") or c["hidden_size"]
    out = {
        "fc.weight": TensorRule((H, 3 * Ht)),
        "midlayer.hidden_norm.weight": TensorRule((H,)),
        "norm.weight": TensorRule((H,)),
        "lm_head.weight": TensorRule((Vd, H)),
        "d2t": TensorRule((Vd,), dtype="int64"),
        "t2d": TensorRule((V,), required=False, dtype="bool"),  # both engines skip it; kept for tools
        "embed_tokens.weight": TensorRule((V, H), required=False),
    }
    if c.get("bias"):  # SGLang builds fc with bias=config.bias
        out["fc.bias"] = TensorRule((H,))
    out.update(llama_layer_rules("midlayer.", c, 2 * H, input_norm=True))
    return out


def medusa_rules(c: dict[str, Any]) -> dict[str, TensorRule]:
    """vLLM Medusa: ResidualBlock ``layers`` with bias, then one lm_head per head, or a single
    shared one (``lm_heads.0.weight``) when ``original_lm_head`` is set."""
    H, V = c["hidden_size"], c.get("truncated_vocab_size") or c["vocab_size"]
    out: dict[str, TensorRule] = {}
    for i in range(c["num_heads"]):
        for j in range(c["num_hidden_layers"]):
            out[f"blocks.{i}.layers.{j}.weight"] = TensorRule((H, H))
            if c.get("medusa_fc_bias"):
                out[f"blocks.{i}.layers.{j}.bias"] = TensorRule((H,))
    for i in range(1 if c.get("original_lm_head") else c["num_heads"]):
        out[f"lm_heads.{i}.weight"] = TensorRule((V, H))
    return out


def dflash_rules(reduced_vocab: bool) -> Callable[[dict[str, Any]], dict[str, TensorRule]]:
    """DFlash (both engines): Qwen3 layers with q/k norms, ``fc`` over the K target layers,
    ``hidden_norm`` and ``norm``; the embedding and lm_head are the target's. With
    ``reduced_vocab`` (vLLM) a ``draft_vocab_size`` below ``vocab_size`` needs its own
    ``lm_head`` [Vd, H] and ``d2t``."""

    def rules(c: dict[str, Any]) -> dict[str, TensorRule]:
        H, V, hd = c["hidden_size"], c["vocab_size"], _head_dim(c)
        nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
        K = len((c.get("dflash_config") or {}).get("target_layer_ids") or [])
        out = {
            "fc.weight": TensorRule((H, K * H)),
            "hidden_norm.weight": TensorRule((H,)),
            "norm.weight": TensorRule((H,)),
        }
        for i in range(c["num_hidden_layers"]):
            prefix = f"layers.{i}."
            out.update(llama_layer_rules(prefix, c, H, input_norm=True))
            out[f"{prefix}self_attn.q_norm.weight"] = TensorRule((hd,))
            out[f"{prefix}self_attn.k_norm.weight"] = TensorRule((hd,))
            if c.get("attention_bias"):  # q/k/v and o_proj alike (both engines)
                for name, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd), ("o", H)):
                    out[f"{prefix}self_attn.{name}_proj.bias"] = TensorRule((n,))
        Vd = c.get("draft_vocab_size") or V
        if reduced_vocab and Vd != V:
            out["lm_head.weight"] = TensorRule((Vd, H))
            out["d2t"] = TensorRule((Vd,), dtype="int64")
        return out

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
EAGLE3_FIELDS = LLAMA_FIELDS + ("draft_vocab_size", "target_hidden_size")
DFLASH_FIELDS = LLAMA_FIELDS + ("head_dim", "rope_theta", "block_size", "num_target_layers", "dflash_config")

FORMATS: dict[tuple[str, str], EngineFormat] = {
    ("vllm", "eagle"): EngineFormat(
        "vllm", "eagle", ["LlamaForCausalLM"], "llama", LLAMA_FIELDS, eagle1_rules(False, False)
    ),
    ("sglang", "eagle"): EngineFormat(
        "sglang", "EAGLE", ["LlamaForCausalLMEagle"], "llama", LLAMA_FIELDS, eagle1_rules(True, True)
    ),
    ("vllm", "eagle3"): EngineFormat(
        "vllm",
        "eagle3",
        ["LlamaForCausalLMEagle3"],
        "llama",
        EAGLE3_FIELDS + ("eagle_aux_hidden_state_layer_ids",),
        eagle3_rules,
        forbidden_config=("eagle_config", "bias"),  # vLLM's fc has no bias; nested ids mean layer outputs
    ),
    ("sglang", "eagle3"): EngineFormat(
        "sglang",
        "EAGLE3",
        ["LlamaForCausalLMEagle3"],
        "llama",
        EAGLE3_FIELDS + ("eagle_config",),
        eagle3_rules,
        forbidden_config=("eagle_aux_hidden_state_layer_ids",),
    ),
    ("vllm", "medusa"): EngineFormat(
        "vllm",
        "medusa",
        ["MedusaModel"],
        "medusa",
        ("hidden_size", "vocab_size", "num_heads", "num_hidden_layers", "medusa_fc_bias"),
        medusa_rules,
    ),
    ("vllm", "dflash"): EngineFormat(
        "vllm",
        "dflash",
        ["DFlashDraftModel"],
        "qwen3",
        DFLASH_FIELDS,
        dflash_rules(reduced_vocab=True),
        forbidden_config=("eagle_aux_hidden_state_layer_ids",),  # it would override target_layer_ids
    ),
    ("sglang", "dflash"): EngineFormat(
        "sglang",
        "DFLASH",
        ["DFlashDraftModel"],
        "qwen3",
        DFLASH_FIELDS,
        dflash_rules(reduced_vocab=False),
        forbidden_config=("eagle_aux_hidden_state_layer_ids", "draft_vocab_size"),
    ),
}


# ---- rules beyond names and shapes --------------------------------------------------------------
def aux_layers(config: dict[str, Any]) -> list[int] | None:
    """The EAGLE-3 aux layers a config asks for, as our ids (inputs of layer i); None if absent.

    vLLM's top-level ids are layer inputs (ours); SGLang's ``eagle_config`` ids are layer outputs
    (it captures ``id + 1``).
    """
    if isinstance(config.get("eagle_aux_hidden_state_layer_ids"), list):
        return list(config["eagle_aux_hidden_state_layer_ids"])
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return [i + 1 if isinstance(i, int) else i for i in nested] if isinstance(nested, list) else None


def _check_aux_layers(config: dict[str, Any], target_layers: int | None) -> str | None:
    ids = aux_layers(config)
    if ids is None:
        return "the EAGLE-3 aux layer ids are missing"
    last = target_layers - 1 if target_layers else None
    problem = feature_layers_problem(ids, 3, target_layers, last=last)
    return problem and f"aux layers (as draft.feature_layers) {problem.split(': ', 1)[1]}"


def _check_one_layer(config: dict[str, Any], _: int | None) -> str | None:
    if config.get("num_hidden_layers") != 1:
        return "EAGLE-3 drafters have exactly one layer (num_hidden_layers: 1)"
    return None


def _check_medusa_bias(config: dict[str, Any], _: int | None) -> str | None:
    if config.get("medusa_fc_bias") is not True:
        return "medusa_fc_bias must be true: Medusa ResBlocks have a bias"
    return None


def _check_medusa_heads(config: dict[str, Any], _: int | None) -> str | None:
    if not isinstance(config.get("num_heads"), int) or config["num_heads"] < 1:
        return "num_heads must be the number of heads in the file (at least 1)"
    return None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_dflash_layer_ids(config: dict[str, Any], target_layers: int | None) -> str | None:
    ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(_int(i) for i in ids):
        return "dflash_config.target_layer_ids must be a non-empty list of layer ids"
    depth = config.get("num_target_layers")
    if target_layers is not None and depth != target_layers:
        return f"num_target_layers={depth} but the target has {target_layers} layers"
    L = depth if _int(depth) else target_layers
    if min(ids) < 0 or (L is not None and max(ids) > L - 2):
        top = "L-2" if L is None else L - 2
        return f"dflash_config.target_layer_ids={ids} must be layer outputs in 0..{top} (the engines capture id + 1)"
    problem = dflash_layers_problem([i + 1 for i in ids])
    return problem and f"dflash_config.target_layer_ids={ids}: {problem.split(': ', 1)[1]}"


def _check_dflash_mask(config: dict[str, Any], _: int | None) -> str | None:
    mask, vocab = (config.get("dflash_config") or {}).get("mask_token_id"), config.get("vocab_size")
    if not _int(mask) or not _int(vocab) or not 0 <= mask < vocab:
        return f"dflash_config.mask_token_id={mask!r} must be a token id of the target (0..vocab_size-1)"
    return None


def _check_dflash_block(config: dict[str, Any], _: int | None) -> str | None:
    block = config.get("block_size")
    if not _int(block) or block < 2:
        return f"block_size={block!r} must be an integer of at least 2"
    return None


def _check_dflash_silu(config: dict[str, Any], _: int | None) -> str | None:
    act = config.get("hidden_act")
    return None if act == "silu" else f"hidden_act={act!r}: the engines' DFlash MLP is SiLU-gated only"


def _check_dflash_non_causal(config: dict[str, Any], _: int | None) -> str | None:
    types = config.get("layer_types")
    if (
        (config.get("dflash_config") or {}).get("causal")
        or config.get("use_sliding_window")
        or (
            types is not None
            and (len(types) != config.get("num_hidden_layers") or set(types) != {"full_attention"})
        )
    ):
        return "every drafter layer must be non-causal full attention (layer_types full_attention, no causal, no sliding window)"
    return None


def _check_dflash_rope(config: dict[str, Any], _: int | None) -> str | None:
    theta = config.get("rope_theta")
    nested = (config.get("rope_parameters") or {}).get("rope_theta", theta)
    if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0 or nested != theta:
        return f"rope_theta={theta!r} must be the drafter's RoPE base, equal to rope_parameters.rope_theta"
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "aux-layers",
        (("vllm", "eagle3"), ("sglang", "EAGLE3")),
        "three aux layers, distinct, ascending, inputs of layers 1..L-1: the target appends "
        "`hidden_states + residual` at each listed layer in layer order (unsorted ids permute fc's "
        "input, duplicates shrink it, layer 0 has no residual); SGLang captures id + 1",
        (
            "vllm/model_executor/models/llama.py",
            "vllm/model_executor/models/llama_eagle3.py",
            "vllm/model_executor/models/eagle3_utils.py",
            "sglang/srt/models/llama.py",
            "sglang/srt/models/llama_eagle3.py",
        ),
        _check_aux_layers,
    ),
    Rule(
        "eagle3-one-layer",
        (("vllm", "eagle3"), ("sglang", "EAGLE3")),
        "one decoder layer (`midlayer`) whose q/k/v read concat(embedding, feature), 2H",
        ("vllm/model_executor/models/llama_eagle3.py", "sglang/srt/models/llama_eagle3.py"),
        _check_one_layer,
    ),
    Rule(
        "eagle1-fc-no-bias",
        (("vllm", "eagle"),),
        "fc is built without a bias and fc.bias is dropped (a drafter trained with "
        "draft.fc_bias=true is refused unless its bias is zero)",
        ("vllm/model_executor/models/llama_eagle.py",),
        lambda config, _: None,  # enforced by the tensor table: fc.bias is an unexpected key
    ),
    Rule(
        "medusa-bias",
        (("vllm", "medusa"),),
        "ResidualBlock layers have a bias only with medusa_fc_bias: true",
        ("vllm/model_executor/models/medusa.py", "vllm/transformers_utils/configs/medusa.py"),
        _check_medusa_bias,
    ),
    Rule(
        "medusa-heads",
        (("vllm", "medusa"),),
        "num_heads is the heads in the file, and num_speculative_tokens must equal it: vLLM copies "
        "it into num_heads (num_lookahead_tokens), so fewer serves fewer heads and more builds "
        "heads without weights",
        ("vllm/config/speculative.py", "vllm/transformers_utils/configs/medusa.py"),
        _check_medusa_heads,
    ),
    Rule(
        "medusa-original-lm-head",
        (("vllm", "medusa"),),
        "original_lm_head: true shares one lm_head, read from lm_heads.0.weight, across all heads",
        ("vllm/model_executor/models/medusa.py",),
        lambda config, _: None,  # enforced by the tensor table (one lm_heads.0.weight)
    ),
    Rule(
        "dflash-layer-ids",
        DFLASH_METHODS,
        "dflash_config.target_layer_ids are layer outputs (our feature_layers - 1), distinct, ascending, "
        "in 0..L-2, and num_target_layers is the target's depth L: vLLM adds 1 to make its aux-layer ids "
        "(a top-level eagle_aux_hidden_state_layer_ids would override them), SGLang captures id + 1 and "
        "range-checks ids against num_target_layers; fc reads K = len(ids) target states",
        (
            "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
            "vllm/model_executor/models/qwen3_dflash.py",
            "sglang/srt/speculative/dflash_utils.py",
            "sglang/srt/models/dflash.py",
        ),
        _check_dflash_layer_ids,
    ),
    Rule(
        "dflash-mask-token",
        DFLASH_METHODS,
        "dflash_config.mask_token_id is a token id of the target: vLLM fills the block's draft slots "
        "with it; without it SGLang looks up the string <|MASK|> in the tokenizer and adds it, which "
        "fails when the vocabulary is full",
        (
            "vllm/v1/worker/gpu/spec_decode/utils.py",
            "sglang/srt/speculative/dflash_worker.py",
            "sglang/srt/speculative/dflash_utils.py",
        ),
        _check_dflash_mask,
    ),
    Rule(
        "dflash-block-size",
        DFLASH_METHODS,
        "block_size (at least 2) is the trained block: vLLM runs 1 + num_speculative_tokens queries per "
        "step (serve with num_speculative_tokens = block_size - 1); SGLang's block is "
        "--speculative-num-draft-tokens (serve with block_size; it warns on a mismatch and uses the flag)",
        (
            "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py",
            "sglang/srt/speculative/dflash_worker.py",
            "sglang/srt/server_args.py",
        ),
        _check_dflash_block,
    ),
    Rule(
        "dflash-silu",
        DFLASH_METHODS,
        "the drafter MLP is gate/up/down with SiLU (other activations are refused)",
        ("vllm/model_executor/models/qwen2.py", "sglang/srt/models/dflash.py"),
        _check_dflash_silu,
    ),
    Rule(
        "dflash-non-causal",
        DFLASH_METHODS,
        "layers are non-causal full attention: a sliding_attention layer type (or dflash_config.causal) "
        "makes the engines run that layer causally",
        ("vllm/model_executor/models/qwen3_dflash.py", "sglang/srt/models/dflash.py"),
        _check_dflash_non_causal,
    ),
    Rule(
        "dflash-rope-theta",
        DFLASH_METHODS,
        "rope_theta is written: a missing one becomes transformers' config default (10000) before the "
        "engines' own fallbacks (vLLM set_default_rope_theta, SGLang getattr) are reached, which silently "
        "rotates the drafter's q/k differently from training",
        ("vllm/model_executor/models/qwen3_dflash.py", "sglang/srt/models/dflash.py"),
        _check_dflash_rope,
    ),
    Rule(
        "dflash-vocab",
        DFLASH_METHODS,
        "no embedding or lm_head (both are the target's; vLLM would load copies); a reduced draft "
        "vocabulary is read by vLLM only (draft_vocab_size, lm_head [Vd, H], d2t; t2d skipped), SGLang "
        "drafts with the target's full lm_head and skips d2t",
        (
            "vllm/model_executor/models/qwen3_dflash.py",
            "vllm/v1/worker/gpu/spec_decode/dflash/utils.py",
            "sglang/srt/models/dflash.py",
            "sglang/srt/speculative/dflash_worker.py",
        ),
        lambda config, _: None,  # enforced by the tensor table and SGLang's forbidden draft_vocab_size
    ),
)


def rules_for(engine: str, method: str) -> list[Rule]:
    """The rules that apply to ``engine``'s ``method`` loader."""
    return [r for r in RULES if (engine, method) in r.methods]


# ---- validation -------------------------------------------------------------------------------
def format_of(config: dict[str, Any], engine: str) -> EngineFormat:
    """The engine format that ``config`` declares (by model_type and architectures)."""
    arch = (config.get("architectures") or [None])[0]
    for (eng, _), fmt in FORMATS.items():
        if eng == engine and fmt.model_type == config.get("model_type") and fmt.architectures == [arch]:
            return fmt
    raise UserError(
        f"config.json (model_type {config.get('model_type')!r}, architectures {[arch]}) is not a {engine} "
        "drafter format draftheads knows"
    )


def _dtype_ok(t: torch.Tensor, family: str) -> bool:
    if family == "int64":
        return t.dtype == torch.int64
    if family == "bool":
        return t.dtype == torch.bool
    return t.is_floating_point()


def tensor_problems(tensors: dict[str, torch.Tensor], rules: dict[str, TensorRule]) -> list[str]:
    """Every way ``tensors`` differs from ``rules``: missing, unexpected, wrong shape or dtype."""
    problems = [f"missing {k}" for k, r in rules.items() if r.required and k not in tensors]
    problems += [f"unexpected {k} (the engine would skip it)" for k in tensors if k not in rules]
    for k, t in tensors.items():
        r = rules.get(k)
        if r is None:
            continue
        if tuple(t.shape) != r.shape:
            problems.append(f"{k} has shape {tuple(t.shape)}, the engine builds {r.shape}")
        elif not _dtype_ok(t, r.dtype):
            problems.append(f"{k} has dtype {t.dtype}, the engine expects {r.dtype}")
    return problems


def config_problems(config: dict[str, Any], fmt: EngineFormat, target_layers: int | None = None) -> list[str]:
    """Missing or forbidden config fields for ``fmt``, then every broken :data:`RULES` entry (with its source)."""
    problems = [f"config.json lacks {f}" for f in fmt.config_fields if config.get(f) is None]
    problems += [
        f"config.json must not set {f} for {fmt.engine}" for f in fmt.forbidden_config if f in config
    ]
    if problems:
        return problems
    for rule in rules_for(fmt.engine, fmt.method):
        problem = rule.check(config, target_layers)
        if problem:
            problems.append(f"{problem} ({rule.sources[0]})")
    return problems


def validate_export(
    directory: str | os.PathLike, engine: str, target_layers: int | None = None
) -> EngineFormat:
    """Check an exported directory against the engine's spec and rules; returns its format or raises.

    ``target_layers`` (the target's depth) enables the aux-layer range check.
    """
    directory = Path(directory)
    cfg_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not cfg_path.is_file() or not weights.is_file():
        raise UserError(f"{directory}: an engine drafter needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        config = json.loads(cfg_path.read_text())
        tensors = load_file(str(weights))
    except (json.JSONDecodeError, SafetensorError, OSError) as e:
        raise UserError(f"{directory}: unreadable export ({e})") from None
    fmt = format_of(config, engine)
    problems = config_problems(config, fmt, target_layers)
    if not problems:
        problems = tensor_problems(tensors, fmt.tensors(config))
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UserError(f"{directory} does not match {engine} {fmt.method}: {'; '.join(problems[:3])}{more}")
    return fmt
