"""Dynamic trees (Li et al., 2024) as pure tensor steps: expand by cumulative log-confidence, then rerank.

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


class Expansion:
    """A dynamic tree's level-by-level state: every candidate so far and the frontier to expand next.

    Made from the root's draft log-probs ``[B, V]`` and output state ``[B, H]``; each
    :meth:`grow` adds the top-k children of the k frontier nodes from their drafted log-probs and
    keeps the k best as the next frontier (their output states and fed ancestors with them).
    Only tensor shapes depend on the level, so a fixed-depth loop over it compiles as one graph.
    """

    def __init__(self, root_logp: torch.Tensor, h_root: torch.Tensor, k: int) -> None:
        B, dev = root_logp.shape[0], root_logp.device
        top = root_logp.topk(k, dim=-1)
        self.k = k
        self.scores, self.ids = [top.values], [top.indices]
        self.parents = [torch.full((B, k), -1, dtype=torch.long, device=dev)]
        self.depths = [torch.ones(B, k, dtype=torch.long, device=dev)]
        self.front = torch.arange(k, device=dev).expand(B, k)  # candidate ids of the frontier
        self.front_hidden = h_root[:, None].expand(B, k, -1)
        self.front_anc = torch.zeros(B, k, 0, dtype=torch.bool, device=dev)  # their fed ancestors
        self.eye = torch.eye(k, dtype=torch.bool, device=dev).expand(B, k, k)
        self.offset = k

    def all_scores(self) -> torch.Tensor:
        return torch.cat(self.scores, 1)

    def frontier_scores(self) -> torch.Tensor:
        return self.all_scores().gather(1, self.front)

    def frontier_ids(self) -> torch.Tensor:
        """Draft ids of the frontier nodes ``[B, k]``."""
        return torch.cat(self.ids, 1).gather(1, self.front)

    def frontier_ancestors(self) -> torch.Tensor:
        """``[B, k, fed so far + k]``: each frontier node's fed ancestors, then itself."""
        return torch.cat([self.front_anc, self.eye], -1)

    def grow(self, logp: torch.Tensor, out: torch.Tensor, new_anc: torch.Tensor, depth: int) -> None:
        """Add the children drafted at ``depth`` (the frontier's ``logp [B, k, V]`` and output states
        ``out [B, k, H]``, fed with ancestors ``new_anc``) and move the frontier to the best k."""
        c_scores, c_ids, slot = children(logp, self.frontier_scores(), self.k)
        self.scores.append(c_scores)
        self.ids.append(c_ids)
        self.parents.append(self.front.gather(1, slot))
        self.depths.append(torch.full_like(c_ids, depth))
        pick = frontier(c_scores, self.k)
        pslot = slot.gather(1, pick)
        self.front = self.offset + pick
        self.offset += c_scores.shape[1]
        self.front_hidden = out.gather(1, pslot[..., None].expand(-1, -1, out.shape[-1]))
        self.front_anc = new_anc.gather(1, pslot[..., None].expand(-1, -1, new_anc.shape[-1]))

    def tree(self, root: torch.Tensor, to_target, n: int):
        """The ``n`` best candidates plus the root (:func:`rerank`), tokens as target ids."""
        return rerank(
            root,
            self.all_scores(),
            to_target(torch.cat(self.ids, 1)),
            torch.cat(self.parents, 1),
            torch.cat(self.depths, 1),
            n,
        )
