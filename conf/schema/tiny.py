"""Tiny random-init targets of every architecture the project is tested on (``target.tiny=NAME``).

Each entry is a transformers config of that architecture, four layers of width 64, small enough for
a unit test and real enough to run the architecture's own attention, rotary, cache and routing code:
sliding windows (and Llama-4's chunks) of 8 tokens, so a short test prompt already crosses them;
mixtures of 4 experts; DeepSeek-V3's low-rank (MLA) attention; Qwen3.5's linear-attention layers.
The names are transformers' ``model_type``; they borrow the embedded tokenizer (see
:func:`draftheads.heads.target.load.build_tiny`).
"""

from __future__ import annotations

from typing import Any

WINDOW = 8  # sliding-window (and chunked-attention) width of the tiny configs: crossed by any test


def tiny_decoder(model_type: str, **extra: Any) -> dict[str, Any]:
    """A Llama-like tiny config: 4 layers of width 64, 4 query and 2 key/value heads of size 16."""
    base: dict[str, Any] = dict(
        model_type=model_type,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return {**base, **extra}


SLIDING_THEN_FULL = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
MOE = dict(num_local_experts=4, num_experts_per_tok=2)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": tiny_decoder("llama"),
    # transformers' default window (4096) would never be reached by a test: the tiny one is
    "mistral": tiny_decoder("mistral", sliding_window=WINDOW),
    "qwen2": tiny_decoder("qwen2", use_sliding_window=False),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=4, n_head=4, n_positions=1024),
    "qwen3": tiny_decoder("qwen3", head_dim=16),
    "qwen3_moe": tiny_decoder(
        "qwen3_moe", head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2
    ),
    "qwen3_5_text": tiny_decoder(
        "qwen3_5_text",
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    ),
    "mixtral": tiny_decoder("mixtral", **MOE),
    "gemma2": tiny_decoder("gemma2", head_dim=16, sliding_window=WINDOW, layer_types=SLIDING_THEN_FULL),
    "gemma3_text": tiny_decoder(
        "gemma3_text", head_dim=16, sliding_window=WINDOW, layer_types=SLIDING_THEN_FULL
    ),
    "gemma4_text": tiny_decoder(
        "gemma4_text",
        head_dim=16,
        global_head_dim=16,
        sliding_window=WINDOW,
        layer_types=SLIDING_THEN_FULL,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
    ),
    "phi3": tiny_decoder("phi3"),
    "gpt_oss": tiny_decoder(
        "gpt_oss", head_dim=16, sliding_window=WINDOW, layer_types=SLIDING_THEN_FULL, **MOE
    ),
    "deepseek_v3": tiny_decoder(
        "deepseek_v3",
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        head_dim=8,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
    ),
    "llama4_text": tiny_decoder(
        "llama4_text",
        head_dim=16,
        intermediate_size_mlp=128,
        attention_chunk_size=WINDOW,
        num_local_experts=4,
        num_experts_per_tok=1,
        layer_types=["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"],
    ),
    "glm4_moe": tiny_decoder(
        "glm4_moe",
        head_dim=16,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
    ),
    "olmo2": tiny_decoder("olmo2"),
    "cohere2": tiny_decoder("cohere2", sliding_window=WINDOW, layer_types=SLIDING_THEN_FULL),
    "granite": tiny_decoder("granite"),
}
