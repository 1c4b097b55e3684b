"""Training objectives as pure functions of tensors.

Alignment, for a row x_0 .. x_{T-1} with ``loss_mask[t] = 1`` when x_t is an assistant token
the drafter should learn to predict, and f_t the target's hidden state at t (which the
target's lm_head turns into its prediction of x_{t+1}):

* Medusa head k (0-based) reads f_t and predicts x_{t+k+2}  -> label ``x[t+k+2]``;
* EAGLE step s at row t reads (f_t, x_{t+1}) at s = 0, then its own previous output with
  x_{t+s+1}, and predicts f_{t+s+1} and x_{t+s+2}     -> target position ``p = t+s+1``.

Both count a prediction of x_j only where ``loss_mask[j] = 1`` and, in packed rows (which
carry ``position_ids``), only when x_j lies in the same document as the position that predicts
it. Every loss is a mean over the counted positions and is 0 (still attached to the graph) when
there are none, so a batch without assistant tokens cannot produce a NaN.

* DFlash: a block anchored at answer position a holds x_a then mask tokens at positions
  a .. a+B-1, sees the target's features at positions < a of its document, and its position k
  (1 .. B-1) predicts x_{a+k}: the target's next token at a+k-1 -> label ``x[a+k]`` (or the
  cached top-k at a+k-1).

Each function also returns statistics as *sums and counts* (``Stats``) so that they can be
added over micro-batches and ranks and divided once, exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from draftheads.heads.masks import document_ids

IGNORE = -100
Stats = dict[str, torch.Tensor]


def label_mask(
    loss_mask: torch.Tensor, offset: int, position_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, T]`` bool: position t counts a prediction of x_{t+offset}.

    That is ``loss_mask[t+offset]``, and for packed rows also "t+offset is in t's document",
    i.e. ``position_ids[t+offset] == position_ids[t] + offset`` (documents are contiguous and
    count positions from 0). False where t+offset falls past the end.
    """
    keep = shift_left(loss_mask, offset).bool()
    if position_ids is not None:
        keep &= shift_left(position_ids, offset, -1) == position_ids + offset
    return keep


def future_labels(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, offset: int, position_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """``labels[b, t] = input_ids[b, t+offset]`` where :func:`label_mask`, else IGNORE.

    Medusa head k uses ``offset = k + 2``.
    """
    keep = label_mask(loss_mask, offset, position_ids)
    return torch.where(keep, shift_left(input_ids, offset), IGNORE)


def shift_left(x: torch.Tensor, offset: int, fill: float | int = 0) -> torch.Tensor:
    """``out[:, t] = x[:, t+offset]`` along dim 1, padded with ``fill`` past the end."""
    out = torch.full_like(x, fill)
    T = x.shape[1]
    if offset < T:
        out[:, : T - offset] = x[:, offset:]
    return out


def masked_mean(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """sum(values * weight) / max(sum(weight), 1): 0 with a graph when nothing is counted."""
    return (values * weight).sum() / weight.sum().clamp(min=1)


def topk_hits(logits: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of rows whose label is the argmax, and within the top-k, of ``logits [N, V]``."""
    if logits.shape[0] == 0:
        zero = logits.new_zeros(())
        return zero, zero
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
    hit = top == labels[:, None]
    return hit[:, 0].sum().float(), hit.any(-1).sum().float()


def head_stats(prefix: str, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, k: int) -> Stats:
    n = logits.new_tensor(float(labels.numel()))
    top1, topk = topk_hits(logits.detach(), labels, k)
    return {
        f"{prefix}/loss_sum": loss.detach() * n,
        f"{prefix}/n": n,
        f"{prefix}/top1": top1,
        f"{prefix}/top{k}": topk,
    }


def medusa_loss(
    head_hidden: torch.Tensor,
    logits_fn,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    weight: float,
    decay: float,
    topk: int = 5,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """Medusa-1: L = sum_k weight * decay**k * CE(head_k(f_t), x_{t+k+2}) over counted positions.

    ``head_hidden`` is ``[K, B, T, H]`` (each head's ResBlock output) and ``logits_fn(k, h)``
    applies head k's lm_head. Logits are only formed for the counted rows, so the vocabulary
    projection costs nothing on prompt and padding tokens.
    """
    total = head_hidden.new_zeros(())
    stats: Stats = {}
    for k in range(head_hidden.shape[0]):
        labels = future_labels(input_ids, loss_mask, k + 2, position_ids)
        rows = labels != IGNORE
        y = labels[rows]
        logits = logits_fn(k, head_hidden[k][rows]).float()
        ce = F.cross_entropy(logits, y, reduction="sum") / max(y.numel(), 1)
        total = total + weight * decay**k * ce
        stats.update(head_stats(f"head{k}", ce, logits, y, topk))
    return total, stats


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Per row: -sum_v softmax(target)_v * log_softmax(logits)_v (EAGLE's token loss)."""
    return -(target_logits.float().softmax(-1) * logits.float().log_softmax(-1)).sum(-1)


def topk_teacher(
    topk_ids: torch.Tensor, topk_logits: torch.Tensor, t2d: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k logits ``[N, k]`` as soft labels: ``(ids, probs)``, each ``[N, k]``.

    ``probs`` is the softmax over the top-k entries that the drafter can predict (renormalised
    over them); ``ids`` index the drafter's vocabulary: the draft vocabulary when ``t2d`` (the
    target -> draft membership mask of EAGLE-3) is given, mapped in order, else the target's.
    Entries outside the draft vocabulary get probability 0 (id 0); a row with none left is all 0.
    """
    ids = topk_ids.long()
    keep = torch.ones_like(ids, dtype=torch.bool) if t2d is None else t2d[ids]
    if t2d is not None:
        ids = torch.where(keep, (t2d.long().cumsum(0) - 1)[ids], 0)
    logits = topk_logits.float().masked_fill(~keep, float("-inf"))
    probs = torch.nan_to_num(logits.softmax(-1), nan=0.0)
    return ids, probs


def sparse_soft_cross_entropy(logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Per row: -sum_j probs_j * log_softmax(logits)[ids_j]: :func:`soft_cross_entropy` with a
    teacher that is zero outside ``ids`` (the cached top-k), without forming it."""
    return -(probs * logits.float().log_softmax(-1).gather(-1, ids)).sum(-1)


def feature_regression(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row: mean over features of SmoothL1(pred, target) (EAGLE-1's feature loss)."""
    return F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1)


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Per row: KL(teacher || student) = sum_v p_t (log p_t - log p_s) (Medusa-2 self-distillation)."""
    log_t = teacher_logits.float().log_softmax(-1)
    return (log_t.exp() * (log_t - student_logits.float().log_softmax(-1))).sum(-1)


def uniform_noise(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x + U(-scale, scale): EAGLE-1's feature augmentation (drawn from the global torch RNG)."""
    if scale <= 0:
        return x
    return x + (torch.rand_like(x) * 2 - 1) * scale


def head_warmup(schedule: str, step: int, steps: int) -> float:
    """Medusa-2's head-loss factor s(step): sine = sin(pi/2 * min(1, step/steps)), linear, constant."""
    if schedule == "constant" or steps <= 0:
        return 1.0
    frac = min(1.0, step / steps)
    return math.sin(math.pi / 2 * frac) if schedule == "sine" else frac


def lr_factor(schedule: str, step: int, warmup: int, total: int) -> float:
    """Multiplier of the base lr: linear warm-up over ``warmup`` steps, then cosine/linear decay to 0."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1 + math.cos(math.pi * frac)) if schedule == "cosine" else 1.0 - frac


def chain_acceptance(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Tokens gained per target forward along a top-1 chain, for every start position.

    ``correct[s]`` / ``valid[s]`` ([S, ...]) say whether draft step s's top-1 equals the target's
    greedy token and whether that token exists. A step is accepted only when every earlier step
    was, so the gain is 1 (the target's own token) + sum_s prod_{j<=s} correct[j] & valid[j].
    """
    ok = (correct & valid).long()
    return 1 + ok.cumprod(0).sum(0)


# ---- DFlash blocks ---------------------------------------------------------------------------
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
