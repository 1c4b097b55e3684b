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


def causal(t: int, device: torch.device) -> torch.Tensor:
    """Boolean ``[t, t]``: query i sees keys 0..i."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` index of the packed document each token belongs to (a new one where position is 0)."""
    return (position_ids == 0).long().cumsum(-1)


def padded_causal(valid: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, T, T]`` from key validity ``valid [B, T]``: causal over the valid keys.

    Every token sees itself, so a padded query still has one key (no all-masked softmax row).
    """
    T = valid.shape[-1]
    eye = torch.eye(T, dtype=torch.bool, device=valid.device)
    return (causal(T, valid.device)[None] & valid.bool()[:, None, :]) | eye


def packed_causal(position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean ``[B, T, T]``: causal within each packed document, nothing across documents.

    Key j is visible to query i when j <= i, both lie in one document and j is not padding
    (and i always sees itself, as in :func:`padded_causal`).
    """
    docs = document_ids(position_ids)
    valid = torch.ones_like(position_ids, dtype=torch.bool) if attention_mask is None else attention_mask
    return padded_causal(valid) & (docs[:, :, None] == docs[:, None, :])
