"""Token trees from one block draft: per-position candidates -> a chain, a static tree or DDTree.

A block drafter gives, in one pass, a draft distribution q_d for each position d = 1..D
after the root. q_d does not depend on which tokens fill positions 1..d-1 (the block is drafted
in parallel), so a path x_1..x_d has the score ``Σ_j log q_j(x_j)``: a product of marginals.

* :func:`static_tree`: a choices tree (a chain is one) filled as heads that index a static tree
  by depth fill it: the node at depth d with rank r takes position d's r-th likeliest token;
* :func:`best_first`: DDTree, the ``n`` best-scoring paths over the lattice of each position's
  top-k candidates. The best n nodes of depth d are children of the best n of depth d-1 (a node
  whose parent is beaten n times is beaten n times too: the same token under each better
  parent), so a beam of n per depth is exact; :func:`draftheads.decode.dynamic.rerank` then
  keeps the n best over all depths, closed under parents.

Scores are log-probabilities; the trees' first node is the root (score 0).
"""

from __future__ import annotations

import torch

from draftheads.decode.dynamic import rerank
from draftheads.decode.tree import StaticTree, ancestor_mask


def tree_setup(static: StaticTree | None, cfg, vocab: int) -> tuple[int, int, tuple | None]:
    """What a one-pass proposer (every position drafted in parallel) builds its trees from: candidates per
    position (the static tree's widest level, else ``decode.top_k_draft``, at most the draft
    vocabulary), DDTree's nodes after the root, and the static tree as tensors (parents, depths,
    ranks, ancestors; None without one), so that filling it reads nothing on the host."""
    topk = min(max(static.topk_per_depth()) if static is not None else cfg.top_k_draft, vocab)
    tree = (
        None
        if static is None
        else (static.parents, static.depths, static.ranks, ancestor_mask(static.parents, static.depth))
    )
    return topk, cfg.total_tokens - 1, tree


def static_tree(
    root: torch.Tensor, values: torch.Tensor, ids: torch.Tensor, tree: StaticTree
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, log scores)`` ``[B, T]`` of ``tree`` filled from the per-position top-k
    ``values``/``ids`` ``[B, D, k]`` (k > every rank, D >= the tree's depth)."""
    return fill_static(root, values, ids, tree.depths, tree.ranks, ancestor_mask(tree.parents, tree.depth))


def fill_static(
    root: torch.Tensor,
    values: torch.Tensor,
    ids: torch.Tensor,
    depths: torch.Tensor,
    ranks: torch.Tensor,
    anc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`static_tree` from the tree's ``depths``/``ranks`` ``[T]`` and ancestor mask
    ``anc [T, T]``: tensors only, so nothing is read on the host (a captured step takes them
    as inputs)."""
    B = root.shape[0]
    depth, rank = depths[1:] - 1, ranks[1:]
    tokens = torch.cat([root[:, None], ids[:, depth, rank]], 1)
    logq = torch.cat([torch.zeros(B, 1, device=values.device), values[:, depth, rank].float()], 1)
    # a node's score: Σ log q over itself and its ancestors (the root's log q is 0)
    return tokens, logq @ anc.to(logq.dtype).T


def best_first(
    root: torch.Tensor, values: torch.Tensor, ids: torch.Tensor, n: int, depth: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DDTree of the ``n`` best paths of at most ``depth`` tokens over the per-position top-k
    ``values``/``ids`` ``[B, D, k]``: ``(tokens, parents, depths, log scores)`` ``[B, n' + 1]``,
    n' = min(n, candidates), root first, parents before children."""
    B, D, k = values.shape
    dev = values.device
    front = torch.zeros(B, 1, device=dev)  # the beam's scores (depth 0: the root)
    front_index = torch.full((B, 1), -1, dtype=torch.long, device=dev)  # their candidate ids
    scores, tokens, parents, depths = [], [], [], []
    offset = 0
    for d in range(min(depth, D)):
        cand = (front[:, :, None] + values[:, d, None, :].float()).flatten(1)  # [B, f*k]
        keep = cand.topk(min(n, cand.shape[1]), dim=-1).indices
        scores.append(cand.gather(1, keep))
        tokens.append(ids[:, d].gather(1, keep % k))
        parents.append(front_index.gather(1, keep // k))
        depths.append(torch.full_like(keep, d + 1))
        front = scores[-1]
        front_index = offset + torch.arange(keep.shape[1], device=dev).expand(B, -1)
        offset += keep.shape[1]
    cat = lambda xs: torch.cat(xs, 1)  # noqa: E731
    return rerank(root, cat(scores), cat(tokens), cat(parents), cat(depths), n)
