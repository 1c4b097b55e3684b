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


# ---- a target's own attention pattern per layer kind --------------------------------------------------
def layer_kinds(config) -> list[str]:
    """Each decoder layer's attention kind, as transformers names it: ``config.layer_types`` where
    the model has them; else every layer slides when the config sets a ``sliding_window``
    (Mistral, Mixtral), or attends fully."""
    kinds = getattr(config, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and kinds:
        return list(kinds)
    n = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 1)
    return ["sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"] * n


ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")


def recurrent_kinds(config) -> list[str]:
    """The target's layer kinds that carry a recurrent state instead of keys and values
    (Qwen3-Next's and Qwen3.5's ``linear_attention``, LFM2's ``conv``, Jamba's ``mamba``): a
    state that advanced over a rejected draft cannot be cut back as a KV cache is."""
    kinds = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None) or []
    named = {"attention": "full_attention"}
    return sorted({k for k in kinds if named.get(k, k) not in ATTENTION_KINDS})


def kind_allowed(
    config, kind: str, allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """``allowed [B, q, k]`` narrowed to what a layer of ``kind`` sees, by token position
    (``q_pos [B, q]``, ``k_pos [B, k]``):

    * sliding window w: key at p is seen from q when q - p < w (transformers' overlay);
    * chunked attention c: only keys of the query's chunk, p // c == q // c (Llama-4);
    * full attention (and any kind without a window): ``allowed`` as it is.

    Positions, not cache slots: a left-padded or compacted row keeps the window of its tokens."""
    q, k = q_pos[:, :, None], k_pos[:, None, :]
    if kind == "sliding_attention":
        return allowed & (q - k < int(config.sliding_window))
    if kind == "chunked_attention":
        chunk = int(config.attention_chunk_size)
        return allowed & (
            torch.div(q, chunk, rounding_mode="floor") == torch.div(k, chunk, rounding_mode="floor")
        )
    return allowed


def target_attention_mask(
    config, allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The additive 4-D mask(s) a stock transformers target takes for ``allowed [B, q, k]``
    (causal, padding, tree ancestors), each layer kind with its own window.

    One kind in the model: one tensor, which transformers applies to every layer as given. Several
    (Gemma, GPT-OSS, Cohere2, Llama-4): a dict by kind, which those models read per layer; a
    recurrent kind's entry is None (those layers read their tokens in order, one row at a time)."""
    kinds = dict.fromkeys(layer_kinds(config))
    recurrent = recurrent_kinds(config)
    masks = {
        kind: None
        if kind in recurrent
        else additive_mask(kind_allowed(config, kind, allowed, q_pos, k_pos), dtype)
        for kind in kinds
    }
    return next(iter(masks.values())) if len(masks) == 1 else masks
