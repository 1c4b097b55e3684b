"""What vLLM's and SGLang's DFlash loaders read, and the rules they impose.

Both engines load z-lab's ``DFlashDraftModel``: a Qwen3 config with
``dflash_config.{mask_token_id, target_layer_ids}``, ``block_size`` and ``num_target_layers``;
``layers.{i}.*`` with q/k norms, ``fc`` [H, K*H], ``hidden_norm`` and ``norm``, and no embedding
or lm_head (vLLM alone reads a reduced vocabulary: ``lm_head`` [Vd, H] and ``d2t``).

The rules were read from vLLM's ``model_executor/models/qwen3_dflash.py`` (commit
036a00d1), ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` (0cfdd2e1) and
``v1/worker/gpu/spec_decode/dflash/utils.py`` (055e47c2), ``dflash/speculator.py`` (00746147)
and ``spec_decode/utils.py``, and from SGLang's
``srt/models/dflash.py`` (7f151c5e, 003b23d7), ``srt/speculative/dflash_utils.py`` (00731f0b)
and ``srt/speculative/dflash_worker.py`` (7f151c5e). Both engines read ``target_layer_ids`` as
layer *outputs* (vLLM adds one to make its aux-layer ids, SGLang captures ``id + 1``): our
``feature_layers`` minus one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftheads.conf.schema.kinds.dflash import dflash_layers_problem
from draftheads.heads.engine.spec import (
    LLAMA_FIELDS,
    EngineFormat,
    Rule,
    TensorRule,
    head_dim,
    llama_layer_rules,
)

DFLASH_METHODS = (("vllm", "dflash"), ("sglang", "DFLASH"))


def dflash_rules(reduced_vocab: bool) -> Callable[[dict[str, Any]], dict[str, TensorRule]]:
    """DFlash (both engines): Qwen3 layers with q/k norms, ``fc`` over the K target layers,
    ``hidden_norm`` and ``norm``; the embedding and lm_head are the target's. With
    ``reduced_vocab`` (vLLM) a ``draft_vocab_size`` below ``vocab_size`` needs its own
    ``lm_head`` [Vd, H] and ``d2t``."""

    def rules(c: dict[str, Any]) -> dict[str, TensorRule]:
        H, V, hd = c["hidden_size"], c["vocab_size"], head_dim(c)
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


DFLASH_FIELDS = LLAMA_FIELDS + ("head_dim", "rope_theta", "block_size", "num_target_layers", "dflash_config")

DFLASH_FORMATS: dict[tuple[str, str], EngineFormat] = {
    ("vllm", "dflash"): EngineFormat(
        "vllm",
        "dflash",
        ["DFlashDraftModel"],
        "qwen3",
        DFLASH_FIELDS,
        dflash_rules(reduced_vocab=True),
        forbidden_config=("eagle_aux_hidden_state_layer_ids",),  # it would override target_layer_ids
        # the block attends both ways, which few of vLLM's attention backends support;
        # FlashAttention is the one vLLM's DFlash drafter is built and tested on (z-lab pins it)
        serve_flags="--attention-backend FLASH_ATTN",
    ),
    ("sglang", "dflash"): EngineFormat(
        "sglang",
        "DFLASH",
        ["DFlashDraftModel"],
        "qwen3",
        DFLASH_FIELDS,
        dflash_rules(reduced_vocab=False),
        forbidden_config=("eagle_aux_hidden_state_layer_ids", "draft_vocab_size"),
        serve_flags="--speculative-num-draft-tokens {block}",  # SGLang's DFLASH block
    ),
}


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


DFLASH_RULES: tuple[Rule, ...] = (
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
