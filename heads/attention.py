"""Grouped-query attention under a mask, without copying the shared keys and values.

With ``H`` query heads over ``H_kv`` key/value heads, head ``h`` reads key/value head
``h // g`` (``g = H / H_kv``). Under a mask, PyTorch's CPU SDPA (``enable_gqa``) and
transformers' SDPA path (``repeat_kv``) both first copy every key/value head ``g`` times: a copy
of the whole cache that grows with the context. Instead the ``g`` query heads of a group stand in
one call as ``g·n`` query rows against their single key/value head:

    q [B, H, n, D] -> [B, H_kv, g·n, D],   mask [B, 1, n, S] -> [B, 1, g·n, S] (each row's mask, g times)
    out = SDPA(q, k, v, mask) [B, H_kv, g·n, D] -> [B, H, n, D]

Each query row meets the same keys, values and mask row as before, so this is the same attention
(to float rounding); only the ``g·n × S`` mask is repeated, never the ``S × D`` cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def foldable(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether :func:`grouped_attention` applies: grouped heads under one mask shared by the heads."""
    H, kv = query.shape[1], key.shape[1]
    return mask is not None and kv != H and H % kv == 0 and mask.dim() == 4 and mask.shape[1] == 1


def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """``softmax(q kᵀ · scale + mask) v`` per head, ``query [B, H, n, D]`` against ``key``/``value``
    ``[B, H_kv, S, D]`` under ``mask [B or 1, 1, n, S]`` (additive or boolean); returns
    ``[B, H, n, D]`` without repeating ``key`` or ``value``."""
    B, H, n, D = query.shape
    kv, S = key.shape[1], key.shape[2]
    g, mb = H // kv, mask.shape[0]
    folded = mask[:, :, None, :, :S].expand(mb, 1, g, n, S).reshape(mb, 1, g * n, S)
    out = F.scaled_dot_product_attention(
        query.reshape(B, kv, g * n, D), key, value, attn_mask=folded, scale=scale
    )
    return out.reshape(B, H, n, D)
