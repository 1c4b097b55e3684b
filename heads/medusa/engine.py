"""What vLLM's Medusa loader reads, and the rules it imposes (SGLang has no Medusa loader).

vLLM ``medusa`` reads ``model_type: medusa`` with ``MedusaModel``: per head,
``blocks.{i}.layers.{j}.{weight,bias}`` ResidualBlocks, then either one ``lm_heads.{i}.weight``
[V, H] per head or, with ``original_lm_head: true``, a single shared ``lm_heads.0.weight``.
"""

from __future__ import annotations

from typing import Any

from draftheads.heads.engine.spec import EngineFormat, Rule, TensorRule


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


MEDUSA_FORMATS: dict[tuple[str, str], EngineFormat] = {
    ("vllm", "medusa"): EngineFormat(
        "vllm",
        "medusa",
        ["MedusaModel"],
        "medusa",
        ("hidden_size", "vocab_size", "num_heads", "num_hidden_layers", "medusa_fc_bias"),
        medusa_rules,
    ),
}


def _check_medusa_bias(config: dict[str, Any], _: int | None) -> str | None:
    if config.get("medusa_fc_bias") is not True:
        return "medusa_fc_bias must be true: Medusa ResBlocks have a bias"
    return None


def _check_medusa_heads(config: dict[str, Any], _: int | None) -> str | None:
    if not isinstance(config.get("num_heads"), int) or config["num_heads"] < 1:
        return "num_heads must be the number of heads in the file (at least 1)"
    return None


MEDUSA_RULES: tuple[Rule, ...] = (
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
)
