"""Training objectives as pure functions of tensors.

Alignment, for a row x_0 .. x_{T-1} with ``loss_mask[t] = 1`` when x_t is an assistant token
the drafter should learn to predict, and f_t the target's hidden state at t (which the
target's lm_head turns into its prediction of x_{t+1}), a prediction of x_{t+o} made at row t
has offset o (:func:`label_mask`, :func:`future_labels`): a head k or a step s that starts from
f_t predicts x_{t+k+2} or x_{t+s+2}. Each kind's objective module says what each of its
predictions reads and which token it predicts.

The labels count a prediction of x_j only where ``loss_mask[j] = 1`` and, in packed rows (which
carry ``position_ids``), only when x_j lies in the same document as the position that predicts
it. Every loss is a mean over the counted positions and is 0 (still attached to the graph) when
there are none, so a batch without assistant tokens cannot produce a NaN.

A block drafter's blocks (anchors, block masks, targets and weights) are its kind's own, beside
its objective (``train/modules/<kind>*.py``).

Each function also returns statistics as *sums and counts* (``Stats``) so that they can be
added over micro-batches and ranks and divided once, exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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

    A head k that reads f_t uses ``offset = k + 2``.
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


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Per row: -sum_v softmax(target)_v * log_softmax(logits)_v: the token loss against the
    target's full distribution."""
    return -(target_logits.float().softmax(-1) * logits.float().log_softmax(-1)).sum(-1)


def topk_teacher(
    topk_ids: torch.Tensor, topk_logits: torch.Tensor, t2d: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k logits ``[N, k]`` as soft labels: ``(ids, probs)``, each ``[N, k]``.

    ``probs`` is the softmax over the top-k entries that the drafter can predict (renormalised
    over them); ``ids`` index the drafter's vocabulary: the draft vocabulary when ``t2d`` (the
    target -> draft membership mask of a reduced draft vocabulary) is given, mapped in order,
    else the target's.
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
    """Per row: mean over features of SmoothL1(pred, target): the loss of a drafter that
    predicts the target's next features."""
    return F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1)


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Per row: KL(teacher || student) = sum_v p_t (log p_t - log p_s)."""
    log_t = teacher_logits.float().log_softmax(-1)
    return (log_t.exp() * (log_t - student_logits.float().log_softmax(-1))).sum(-1)


def uniform_noise(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x + U(-scale, scale): noise on the drafter's input features (drawn from the global torch RNG)."""
    if scale <= 0:
        return x
    return x + (torch.rand_like(x) * 2 - 1) * scale


def head_warmup(schedule: str, step: int, steps: int) -> float:
    """The head-loss factor s(step) of heads trained jointly with LoRA adapters on the target:
    sine = sin(pi/2 * min(1, step/steps)), linear, constant."""
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
