"""Grouped-query attention under a tree mask, without copying the shared keys and values.

A grouped-query target (SmolLM2: 9 query heads share 3 key/value heads) reads each key/value head
``g = H / H_kv`` times. transformers' SDPA path attends with ``enable_gqa`` only when no mask is
passed (a plain greedy step); under a mask, the decoder's every verify step, it first copies each
layer's whole cache ``g`` times (``repeat_kv``). That copy grows with the context: after 1,500
cached tokens it is about 280 MB of fresh memory per step on SmolLM2, more than the step's own
matrix work, and it is what made a long-context verify step cost about 1.5 greedy steps.

The fold. Head ``h`` reads key/value head ``h // g``, so the ``g`` query heads of one group can
stand in one attention call as ``g·n`` query rows against the group's single key/value head:

    q [B, H, n, D] -> [B, H_kv, g·n, D],   mask [B, 1, n, S] -> [B, 1, g·n, S] (each row's mask, g times)
    out = SDPA(q, k, v, mask) [B, H_kv, g·n, D] -> [B, H, n, D]

Every query row still meets the same keys, values and mask row, so the result is the same
attention (to float rounding); only the ``g·n × S`` mask is repeated, not the ``S × D`` cache.

:func:`grouped` switches a target's (and a drafter's) ``sdpa`` attention to this one inside a
block; the decoder's backend blocks (:mod:`~draftheads.decode.backend`) enter it, so the decoder,
its cost model and the same-backend greedy baseline all run it. Without a mask, or without
grouped heads, it is transformers' own SDPA call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

NAME = "draftheads_grouped_sdpa"
_LOCK = threading.Lock()
_HELD: dict[int, list] = {}  # id(config) -> [config, blocks inside, its implementation before]


def grouped_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, n, D]``, ``key``/``value``
    ``[B, H_kv, S, D]``; returns ``[B, n, H, D]``. Folds the query groups under a mask (module
    docstring); otherwise transformers' ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, n, D = query.shape
    kv = key.shape[1]
    mask = attention_mask
    if mask is None or kv == H or mask.dim() != 4 or mask.shape[1] != 1 or (dropout and module.training):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    g, S = H // kv, key.shape[2]
    mask = mask[:, :, :, :S]
    folded = mask[:, :, None].expand(mask.shape[0], 1, g, n, S).reshape(mask.shape[0], 1, g * n, S)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(B, kv, g * n, D), key, value, attn_mask=folded, scale=scaling
    )
    return out.reshape(B, H, n, D).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :data:`NAME` an attention implementation transformers can dispatch to, with SDPA's masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(NAME, grouped_sdpa)
        AttentionMaskInterface.register(NAME, sdpa_mask)


def sdpa_configs(*modules: nn.Module) -> list:
    """The distinct model configs inside ``modules`` whose attention is transformers' ``sdpa``."""
    found: dict[int, object] = {}
    for module in modules:
        for m in module.modules():
            c = getattr(m, "config", None)
            if getattr(c, "_attn_implementation", None) in ("sdpa", NAME) and hasattr(
                c, "num_attention_heads"
            ):
                found.setdefault(id(c), c)
    return list(found.values())


@contextmanager
def grouped(*modules: nn.Module) -> Iterator[None]:
    """``modules``' SDPA attention is :func:`grouped_sdpa` inside the block. Blocks nest and may
    overlap across threads: a config gets its own implementation back when its last block ends."""
    register()
    with _LOCK:
        configs = sdpa_configs(*modules)
        for c in configs:
            held = _HELD.setdefault(id(c), [c, 0, c._attn_implementation])
            held[1] += 1
            c._attn_implementation = NAME
    try:
        yield
    finally:
        with _LOCK:
            for c in configs:
                held = _HELD[id(c)]
                held[1] -= 1
                if held[1] == 0:
                    del _HELD[id(c)]
                    c._attn_implementation = held[2]
