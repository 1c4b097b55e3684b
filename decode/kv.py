"""KV-cache surgery on a stock Hugging Face cache, batched: compaction, truncation, row selection.

Layout. Each row b of a batch owns cache slots ``[0, length[b])`` (its prompt, left padding
included, then its accepted tokens, in order). The cache's physical length is
``max_b length[b]``; slots past ``length[b]`` hold garbage that the attention mask hides.
A verification forward appends the T tree tokens at the physical end; compaction then moves
each row's accepted path next to its own prefix and drops everything else.

A target whose layers carry a recurrent state (Qwen3.5's linear attention) gets the model's own
cache (:func:`new_cache`) with its past recorded: a verify pass over a chain advances that state
over every drafted token, and :func:`roll_back` returns it to the last accepted one.
"""

from __future__ import annotations

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.masks import additive_mask, recurrent_kinds, target_attention_mask

# drafted tokens a verify pass over a recurrent target may hold: the states recorded to roll back
RECURRENT_CHAIN = 16


def new_cache(target, keep: int = RECURRENT_CHAIN):
    """An empty cache for ``target``'s forward: a ``DynamicCache`` of full layers (each layer's
    window is in the mask); for a target with recurrent layers, the model's own layers, with
    their past recorded for ``keep`` tokens so that many can be rolled back (0: none, for a plain
    loop that never rolls back)."""
    from transformers import DynamicCache

    if not recurrent_kinds(target.config):
        return DynamicCache()
    cache = DynamicCache(config=target.config)
    for layer in cache.layers:
        if hasattr(layer, "activate_past_recording") and keep:
            layer.activate_past_recording(keep)
    return cache


def roll_back(cache, rejected: int) -> None:
    """Return every recurrent layer's state to before the last ``rejected`` tokens it read (0:
    keep all, and drop the recorded past the next pass no longer needs). Key/value layers are
    compacted apart (:func:`compact`)."""
    for layer in getattr(cache, "layers", []):
        if hasattr(layer, "activate_past_recording"):
            layer.crop(-rejected)


def cache_layers(cache) -> list:
    """The per-layer key/value holders of a transformers cache (``DynamicCache.layers``)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise UserError(
            f"{type(cache).__name__} has no per-layer keys/values; the tree decoder needs a transformers DynamicCache"
        )
    for layer in layers:
        if getattr(layer, "is_sliding", False):  # a cache made from the config drops old slots
            raise UserError(
                "the target's cache drops keys past its sliding window, which tree decoding cannot compact; "
                "pass a transformers DynamicCache() made without the config (the windows are in the mask)"
            )
    return [layer for layer in layers if getattr(layer, "keys", None) is not None and layer.keys.numel()]


def seq_length(cache) -> int:
    """Physical length of the cache (slots, garbage included)."""
    layers = cache_layers(cache)
    return int(layers[0].keys.shape[-2]) if layers else 0


def compact(cache, src: torch.Tensor, dst: torch.Tensor, new_length: int) -> None:
    """Move, for every row and layer, slots ``src[b, j]`` to ``dst[b, j]``; then cut to ``new_length``.

    ``src``/``dst`` are ``[B, A]``; padding entries may repeat a real move or write into a row's
    garbage area. All sources are read before anything is written, so overlaps are safe. One
    gather and one in-place scatter per tensor; no host synchronisation.
    """
    for layer in cache_layers(cache):
        for name in ("keys", "values"):
            t = getattr(layer, name)  # [B, heads, S, D]
            shape = (t.shape[0], t.shape[1], src.shape[1], t.shape[3])
            # a target sharded over devices keeps each layer's cache where the layer runs
            s, d = src.to(t.device), dst.to(t.device)
            moved = t.gather(2, s[:, None, :, None].expand(shape))
            t.scatter_(2, d[:, None, :, None].expand(shape), moved)
            setattr(layer, name, t[:, :, :new_length])


def truncate(cache, length: int) -> None:
    """Keep the first ``length`` slots of every layer (drop a drafted tree's entries):
    ``DynamicCache.crop`` with the number of slots to remove."""
    cache.crop(min(length - cache.get_seq_length(), 0))


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` of the batch (finished rows leave the batch): keys and values, and a
    recurrent layer's states (its own row selection)."""
    for layer in cache_layers(cache):
        layer.keys = layer.keys.index_select(0, rows.to(layer.keys.device))
        layer.values = layer.values.index_select(0, rows.to(layer.values.device))
    for layer in getattr(cache, "layers", []):
        if hasattr(layer, "activate_past_recording"):
            layer.reorder_cache(rows)


def append_valid(
    valid: torch.Tensor, lengths: torch.Tensor, new: torch.Tensor, new_length: int
) -> torch.Tensor:
    """Slot validity after writing ``new [B, n]`` at each row's ``lengths[b]``: ``[B, new_length]``."""
    B, S = valid.shape
    slot = torch.arange(new_length, device=valid.device)[None]
    old = torch.nn.functional.pad(valid, (0, max(new_length - S, 0)))[:, :new_length] & (
        slot < lengths[:, None]
    )
    rel = slot - lengths[:, None]
    inside = (rel >= 0) & (rel < new.shape[1])
    return old | (inside & new.gather(1, rel.clamp(0, new.shape[1] - 1)))


def slot_positions(cache_valid: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` token position of each cache slot: a row's valid slots hold its tokens in order
    (left padding first, then the prompt and the accepted tokens), so a slot's position is the
    number of valid slots before it."""
    return (cache_valid.long().cumsum(-1) - 1).clamp_min(0)


def tree_mask(
    cache_valid: torch.Tensor,
    anc: torch.Tensor,
    dtype: torch.dtype,
    config=None,
    q_pos: torch.Tensor | None = None,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Mask of T new tokens: each sees its row's valid cache slots and its tree ancestors.

    With the target's ``config`` and the tree tokens' positions ``q_pos [B, T]``, each layer kind
    also keeps its own window (sliding or chunked layers, :func:`target_attention_mask`)."""
    B, T, _ = anc.shape
    allowed = torch.cat([cache_valid[:, None, :].expand(B, T, -1), anc], dim=-1)
    if config is None or q_pos is None:
        return additive_mask(allowed, dtype)
    k_pos = torch.cat([slot_positions(cache_valid), q_pos], dim=-1)
    return target_attention_mask(config, allowed, q_pos, k_pos, dtype)
