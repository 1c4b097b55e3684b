"""What vLLM's and SGLang's EAGLE-1 and EAGLE-3 loaders read, and the rules they impose.

EAGLE-1: vLLM ``eagle`` reads a Llama config (``LlamaForCausalLM``, which it renames) with
``fc.weight`` [H, 2H] and no bias; SGLang ``EAGLE`` reads ``LlamaForCausalLMEagle`` with
``fc.weight`` and ``fc.bias``. Layer 0 has no input norm. EAGLE-3 (``LlamaForCausalLMEagle3``
in both): one ``midlayer`` whose q/k/v read 2H, ``fc`` [H, 3H], ``norm``, ``lm_head`` [Vd, H],
``d2t`` and ``t2d``, and the aux layers, which the engines name differently: vLLM's top-level
``eagle_aux_hidden_state_layer_ids`` are layer inputs (ours), SGLang's ``eagle_config`` ids are
layer outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftheads.conf.schema.kinds.eagle import feature_layers_problem
from draftheads.heads.engine.spec import LLAMA_FIELDS, EngineFormat, Rule, TensorRule, llama_layer_rules


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
    if c.get("norm_before_fc"):  # vLLM: one RMSNorm over the three target states
        out["input_norm.weight"] = TensorRule((3 * Ht,))
    if c.get("fc_norm"):  # vLLM: one RMSNorm per target state
        out.update({f"fc_norm.{i}.weight": TensorRule((Ht,)) for i in range(3)})
    out.update(llama_layer_rules("midlayer.", c, 2 * H, input_norm=True))
    return out


EAGLE3_FIELDS = LLAMA_FIELDS + ("draft_vocab_size", "target_hidden_size")

EAGLE_FORMATS: dict[tuple[str, str], EngineFormat] = {
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
}


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
    return problem and f"aux layers (as draft.eagle.feature_layers) {problem.split(': ', 1)[1]}"


def _check_one_layer(config: dict[str, Any], _: int | None) -> str | None:
    if config.get("num_hidden_layers") != 1:
        return "EAGLE-3 drafters have exactly one layer (num_hidden_layers: 1)"
    return None


EAGLE_RULES: tuple[Rule, ...] = (
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
        "draft.eagle.fc_bias=true is refused unless its bias is zero)",
        ("vllm/model_executor/models/llama_eagle.py",),
        lambda config, _: None,  # enforced by the tensor table: fc.bias is an unexpected key
    ),
)
