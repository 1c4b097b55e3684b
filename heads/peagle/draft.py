"""One decoding pass of a P-EAGLE drafter: the new accepted pairs and a whole group at once.

After the target verifies a step, the drafter has ``n`` new pairs per row (the features of the
accepted positions with the tokens that followed them; ``valid`` marks the real ones: a prefix
after a step, the prompt's left padding excluded after the prefill) and, in its cache, the pairs
of every earlier position (``context``). One forward reads::

    [pair_0 .. pair_{n-1}, mask_1 .. mask_{k-1}]     at positions p_0 .. p_{n-1}, p_a+1 .. p_a+k-1

where a is each row's last valid pair, the anchor. Pairs attend causally to the context and to
each other (as EAGLE-3 feeds them); mask entry d to the context, the valid pairs and mask
entries 1..d (:func:`~draftheads.heads.peagle.group.decode_mask`). The anchor's output and the
mask entries' are the group's k outputs: depth d predicts the token d + 1 after the anchor's
bonus token, ``x_{a+d+2}``. The pairs stay in the cache for the next step; the mask entries
are dropped from it before returning, so a cache holds real pairs only.
"""

from __future__ import annotations

import torch

from draftheads.heads.masks import additive_mask
from draftheads.heads.peagle.group import decode_mask


def parallel_draft(
    drafter,
    features: torch.Tensor,
    next_ids: torch.Tensor,
    positions: torch.Tensor,
    valid: torch.Tensor,
    k: int,
    context: torch.Tensor | None = None,
    cache=None,
) -> torch.Tensor:
    """The group's ``[B, k, H]`` outputs (``drafter.logits`` of them: its k draft distributions).

    ``features [B, n, 3H]`` and ``next_ids``/``positions``/``valid [B, n]`` are the new pairs;
    ``context [B, S]`` marks the cache slots each row may read (None: an empty cache). With a
    ``cache`` (a transformers ``DynamicCache``) the pairs' keys and values are appended to it."""
    B, n = next_ids.shape
    m = k - 1
    last = torch.where(valid, torch.arange(n, device=valid.device), -1).amax(1)  # the anchor
    hidden = drafter.fuse(features)
    mask_rows = drafter.mask_feature().to(hidden.dtype).expand(B, m, -1)
    ids = torch.cat([next_ids, next_ids.new_full((B, m), drafter.mask_token_id)], 1)
    depths = torch.arange(1, k, device=positions.device)
    pos = torch.cat([positions, positions.gather(1, last[:, None]) + depths], 1)
    slots = valid.new_zeros(B, 0) if context is None else context
    mask = additive_mask(decode_mask(slots, valid, k), hidden.dtype)
    out = drafter(ids, torch.cat([hidden, mask_rows], 1), pos, mask, cache)
    if cache is not None and m:
        cache.crop(-m)  # the number of slots to remove
    rows = torch.arange(B, device=out.device)
    return torch.cat([out[rows, last][:, None], out[:, n:]], 1)
