"""DFlash's training blocks as pure functions of tensors: where blocks start (anchors), what each
block attends to, what it predicts and how its positions are weighted, and its FLOPs.

A block anchored at answer position a holds x_a then mask tokens at positions a .. a+B-1, sees
the target's features at positions < a of its document, and its position k (1 .. B-1) predicts
x_{a+k}: the target's next token at a+k-1 -> label ``x[a+k]`` (or the cached top-k at a+k-1).
The alignment and the counting rules are those of :mod:`draftheads.train.objectives`.
"""

from __future__ import annotations

import torch

from draftheads.heads.masks import document_ids
from draftheads.train.objectives import chain_acceptance, label_mask


def documents(valid: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` document index of each token: one per row, or per packed document."""
    return torch.zeros_like(valid, dtype=torch.long) if position_ids is None else document_ids(position_ids)


def anchor_candidates(loss_mask: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T]`` bool: a block may start at a when x_{a+1} is an answer token of a's document
    (so the block's first prediction is counted)."""
    return label_mask(loss_mask, 1, position_ids)


def token_uniforms(valid: torch.Tensor) -> torch.Tensor:
    """One U(0, 1) per real token (``valid [B, T]``), drawn in reading order from the global CPU
    torch RNG (saved in checkpoints), 0 on padding: a micro-batch padded or packed end to end
    draws the same numbers for the same tokens, so both pick the same anchors."""
    mask = valid.bool().cpu()
    u = torch.zeros(mask.shape, dtype=torch.float64)
    u[mask] = torch.rand(int(mask.sum()), dtype=torch.float64)
    return u.to(valid.device)


def gather_anchors(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of ``chosen [B, T]`` per row, ascending: ``(anchors [B, N], keep [B, N])``,
    N the most any row has (at least 1); rows with fewer are padded with anchor 0, keep False."""
    T = chosen.shape[1]
    cols = torch.arange(T, device=chosen.device).expand_as(chosen)
    pos = torch.where(chosen, cols, T).sort(dim=1).values
    pos = pos[:, : max(1, int(chosen.sum(1).max()))]
    keep = pos < T
    return torch.where(keep, pos, 0), keep


def sample_anchors(
    candidates: torch.Tensor, docs: torch.Tensor, per_doc: int, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``per_doc`` anchors per document, uniformly without replacement among its
    ``candidates``: those with the smallest ``uniforms`` (:func:`token_uniforms`).

    Sorting by ``document + uniform`` puts each document's candidates first, in random order;
    a candidate's rank within its document is its sorted index minus the document's first one.
    Returns :func:`gather_anchors` of the chosen positions.
    """
    key = torch.where(candidates, uniforms.double(), 2.0) + 4.0 * docs
    order = key.argsort(dim=1)
    sorted_docs = docs.gather(1, order).contiguous()
    rank = torch.arange(docs.shape[1], device=docs.device) - torch.searchsorted(sorted_docs, sorted_docs)
    pick = (rank < per_doc) & candidates.gather(1, order)
    return gather_anchors(torch.zeros_like(candidates).scatter(1, order, pick))


def chunked_anchors(candidates: torch.Tensor, per_chunk: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every candidate as an anchor, ``per_chunk`` per row at a time (evaluation: every answer
    position, without the training RNG, in passes of bounded size). At least one pass: a batch
    without candidates gives one of padding blocks only."""
    rank = candidates.long().cumsum(1) - 1
    chunks = max(1, (int(candidates.sum(1).max()) + per_chunk - 1) // per_chunk)
    return [gather_anchors(candidates & (rank // per_chunk == c)) for c in range(chunks)]


def block_positions(
    anchors: torch.Tensor, block: int, position_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, N*block]`` positions of the blocks' rows: the anchor's (per-document) position + k."""
    start = anchors if position_ids is None else position_ids.gather(1, anchors)
    return (start[..., None] + torch.arange(block, device=anchors.device)).flatten(1)


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, block: int, mask_id: int) -> torch.Tensor:
    """``[B, N*block]`` block tokens: x_a at each block's first row, the mask token after it."""
    ids = torch.full((*anchors.shape, block), mask_id, dtype=torch.long, device=anchors.device)
    ids[..., 0] = input_ids.gather(1, anchors)
    return ids.flatten(1)


def block_mask(
    anchors: torch.Tensor,
    keep: torch.Tensor,
    block: int,
    docs: torch.Tensor,
    valid: torch.Tensor,
    sees_context: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean ``[B, N*block, T + N*block]`` (True: may attend), keys = the row's T context
    positions, then every block's rows.

    Block j (anchor a_j) sees context position c iff c < a_j, c is in a_j's document and real
    (never its own label positions' features, never another packed document), and its own
    block's rows, bidirectionally; no other block. A padding block (``keep`` False), or one
    whose ``sees_context [B, N]`` is False, sees only itself, so no softmax row is empty.
    """
    T, N = docs.shape[1], anchors.shape[1]
    cols = torch.arange(T, device=docs.device)
    own_doc = docs[:, None, :] == docs.gather(1, anchors)[..., None]
    seen = keep if sees_context is None else keep & sees_context
    ctx = (cols < anchors[..., None]) & own_doc & valid.bool()[:, None, :] & seen[..., None]
    rows = torch.arange(N * block, device=docs.device) // block
    same = (rows[:, None] == rows[None, :]).expand(docs.shape[0], -1, -1)
    return torch.cat([ctx.repeat_interleave(block, dim=1), same], dim=-1)


def block_targets(
    anchors: torch.Tensor,
    keep: torch.Tensor,
    block: int,
    loss_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(source [B, N, block], counted [B, N, block])``: position k of the block at a predicts
    x_{a+k}, the target's next token at ``source = a+k-1`` (clamped into the row); it is
    counted for k >= 1 when a+k is in the row, an answer token, in a's document, and the block
    is real."""
    T = loss_mask.shape[1]
    k = torch.arange(block, device=anchors.device)
    at = anchors[..., None] + k
    safe = at.clamp(max=T - 1)
    counted = (at < T) & (k >= 1) & keep[..., None]
    counted &= loss_mask.gather(1, safe.flatten(1)).view_as(at).bool()
    if position_ids is not None:
        same_doc = position_ids.gather(1, safe.flatten(1)).view_as(at)
        counted &= same_doc == position_ids.gather(1, anchors)[..., None] + k
    return (safe - 1).clamp(min=0), counted


def block_decay(block: int, gamma: float, device: torch.device | None = None) -> torch.Tensor:
    """``[block]`` loss weight of block position k: exp(-(k-1)/gamma) for k >= 1, 0 at the root."""
    k = torch.arange(block, device=device, dtype=torch.float32)
    return torch.where(k >= 1, torch.exp(-(k - 1) / gamma), 0.0)


def dpace_weights(accept: torch.Tensor, counted: torch.Tensor, alpha: float) -> torch.Tensor:
    """``[..., block]`` D-PACE's loss weight of each block position: how much the block's expected
    accepted length grows with that position's log-probability.

    A chain is accepted up to its first miss, so with s_i = (1 - alpha) * p_i + alpha (p_i the
    chance position i is accepted, smoothed so that an early miss does not zero everything
    after it) the expected length is E = sum_j prod_{i<=j} s_i and

        w_k = dE / d log s_k = sum_{j>=k} prod_{i<=j} s_i

    over counted positions (an uncounted one neither counts nor breaks the chain). Position 1
    weighs most; a later one weighs as much as the block's chain is likely to reach it, block by
    block, where a fixed decay gives every block the same."""
    s = torch.where(counted, (1 - alpha) * accept + alpha, torch.ones_like(accept))
    reach = torch.cumprod(s, -1) * counted
    return reach.flip(-1).cumsum(-1).flip(-1) * counted


def block_acceptance(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Tokens a decoder gains per block (``[..., block]`` inputs, position 0 the root): 1 + the
    run of leading positions k >= 1 whose draft top-1 equals the target's greedy token
    (:func:`chain_acceptance` over the block positions), not a per-token accuracy."""
    return chain_acceptance(correct[..., 1:].movedim(-1, 0), valid[..., 1:].movedim(-1, 0))


def dflash_train_flops(
    shape: dict,
    hidden: int,
    features: int,
    layers: int,
    vocab: int,
    rows: int,
    blocks: int,
    keys: int,
    counted: int,
) -> float:
    """Matmul FLOPs of one DFlash training micro-batch, forward and backward.

    ``rows`` context positions computed (padding included), ``blocks`` block rows (N * block per
    batch row), each attending densely over ``keys`` = T + N * block keys, ``counted`` positions
    projected through the draft head. With H the width, K the feature layers, L the drafter
    layers, h/g the query/key-value heads of size D, I the MLP width and V the draft vocabulary::

        4 rows K H^2                      fc (its input is data: weight gradient only)
      + 6 rows L 2 H g D                  every layer's context keys and values
      + 6 blocks L H (2 h D + 2 g D + 3 I)  every layer on the block rows
      + 12 blocks L keys h D              attention scores and values
      + 4 counted H V                     the frozen head (forward and input gradient)
    """
    h, g = shape["num_attention_heads"], shape["num_key_value_heads"]
    D, mlp, H = shape["head_dim"], shape["intermediate_size"], hidden
    context = rows * (4 * features * H * H + 6 * layers * 2 * H * g * D)
    block = blocks * layers * (6 * H * (2 * h * D + 2 * g * D + 3 * mlp) + 12 * keys * h * D)
    return float(context + block + 4 * counted * H * vocab)
