"""Attention masks as pure tensor functions: a boolean "query may attend to key" becomes the
additive float mask that transformers' eager and SDPA attention take as a 4-D ``attention_mask``.

Used by the tree decoder (tree masks), and by training on packed rows, where several documents
share one row and must not see each other.
"""

from __future__ import annotations

import torch


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean ``[B, q, k]`` -> additive ``[B, 1, q, k]``: 0 where allowed, dtype-min elsewhere."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` index of the packed document each token belongs to (a new one where position is 0)."""
    return (position_ids == 0).long().cumsum(-1)


def packed_causal(position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean ``[B, T, T]``: causal within each packed document, nothing across documents.

    Key j is visible to query i when j <= i, both lie in one document and j is not padding.
    Every token sees itself, so a padded query still has one key (no all-masked softmax row).
    """
    T = position_ids.shape[-1]
    docs = document_ids(position_ids)
    causal = torch.ones(T, T, dtype=torch.bool, device=position_ids.device).tril()
    allowed = causal[None] & (docs[:, :, None] == docs[:, None, :])
    if attention_mask is not None:
        allowed &= attention_mask.bool()[:, None, :]
    return allowed | torch.eye(T, dtype=torch.bool, device=position_ids.device)
