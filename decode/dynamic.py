"""EAGLE-2 dynamic trees as pure tensor steps: expand by cumulative log-confidence, then rerank.

Candidates are kept in one flat list per row, level by level, so a parent always has a smaller
index than its children. Each candidate has a score = Σ log q over its path (the draft's
confidence that the whole path is right), a token (a target id), a depth and its parent's
candidate index (-1: the root).

* :func:`children`: the top-k children of each frontier node, scored cumulatively;
* :func:`frontier`: the k best of them, which are expanded at the next level;
* :func:`rerank`: the ``n`` best candidates over all levels become the tree.

A NaN score (a drafter that overflowed) counts as -inf, a path the draft deems impossible: it
is never chosen over a real candidate, and a child of it, -inf too, never over its parent.
"""

from __future__ import annotations

import torch


def children(
    logp: torch.Tensor, parent_scores: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k children of each of n frontier nodes: ``(scores, draft ids, parent slot)``, each [B, n*k].

    score(child) = score(parent) + log q(child | parent); log q <= 0, so a child never outscores
    its parent (this keeps :func:`rerank`'s choice closed under ancestors). NaN scores are -inf.
    """
    B, n, _ = logp.shape
    top = logp.topk(k, dim=-1)
    scores = _no_nan(parent_scores[:, :, None] + top.values)
    slot = torch.arange(n, device=logp.device)[None, :, None].expand(B, n, k)
    return scores.reshape(B, n * k), top.indices.reshape(B, n * k), slot.reshape(B, n * k)


def frontier(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` best-scoring candidates among ``scores [B, M]`` (NaN lowest)."""
    return _no_nan(scores).topk(min(k, scores.shape[-1]), dim=-1).indices


def rerank(
    root: torch.Tensor,
    scores: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree of the ``n`` best candidates plus the root: ``(tokens, parents, depths, scores)``
    [B, n+1] (the root's score is 0, a log-probability of 1).

    A NaN score counts as -inf. A stable descending sort ranks a parent before a child of equal
    score (the parent's index is smaller), so every chosen node's parent is chosen too. Chosen
    candidates are then put back in index order, so parents precede children in the tree.
    """
    B, C = scores.shape
    n = min(n, C)
    scores = _no_nan(scores)
    best = scores.sort(dim=-1, descending=True, stable=True).indices[:, :n]
    chosen = best.sort(dim=-1).values  # [B, n] candidate ids, level order
    node_of = torch.zeros(B, C, dtype=torch.long, device=scores.device)
    node_of.scatter_(1, chosen, torch.arange(1, n + 1, device=scores.device).expand(B, n))
    cand_parent = parents.gather(1, chosen)
    tree_parent = torch.where(cand_parent < 0, 0, node_of.gather(1, cand_parent.clamp_min(0)))
    zero = torch.zeros(B, 1, dtype=torch.long, device=scores.device)
    return (
        torch.cat([root[:, None], tokens.gather(1, chosen)], 1),
        torch.cat([zero, tree_parent], 1),
        torch.cat([zero, depths.gather(1, chosen)], 1),
        torch.cat([zero.to(scores.dtype), scores.gather(1, chosen)], 1),
    )


def _no_nan(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` with NaN as -inf (the lowest log-score), the infinities kept."""
    return torch.where(scores.isnan(), float("-inf"), scores)
