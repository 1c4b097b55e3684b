"""Verification: which path of a drafted tree the target accepts, and the bonus token after it.

Every function takes the target's logits at the tree nodes ``logits [B, T, V]`` (node i's
logits give the distribution of the token *after* node i), the tree ``tokens``/``parents``/
``depths`` ``[B, T]`` and its ancestor mask ``anc [B, T, T]``, and returns
``(best [B], bonus [B])``: the deepest accepted node (0 = only the root) and the next token.

* :func:`greedy_accept`: lossless for greedy decoding.
* :func:`sample_accept`: tree rejection sampling, lossless for sampling (see its proof).
* :func:`typical_accept`: Medusa's typical acceptance. NOT lossless: an explicit opt-in.

``valid [B, T]`` (optional) marks padding nodes False: they are never accepted.
"""

from __future__ import annotations

import torch


def warp(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution (float32 probs), as transformers' warpers in their order:
    logits / temperature, then keep the top_k, then the smallest set with mass >= top_p."""
    x = logits.float() / max(temperature, 1e-5)
    if 0 < top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=False)
        # drop the ascending prefix whose total mass is <= 1 - top_p (keeps at least the top token)
        drop = sorted_x.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1] = False
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return x.softmax(-1)


def _deepest(ok: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """Index of the deepest node with ``ok`` (the first one among equals); the root is always ok."""
    T = ok.shape[-1]
    # depth * T - index: deeper wins, then the lower index (higher-ranked candidate)
    key = torch.where(ok, depths * T + (T - 1 - torch.arange(T, device=ok.device)), -1)
    return key.argmax(-1)


def _path_ok(match: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """A node is accepted when it and all its ancestors match: ok_i = ∧_{j ∈ anc(i)} match_j."""
    return ~(anc & ~match[:, None, :]).any(-1)


def greedy_accept(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest path whose every token is the target's argmax after its parent."""
    pred = logits.argmax(-1)  # [B, T]
    match = tokens == pred.gather(1, parents)
    if valid is not None:
        match &= valid
    match[:, 0] = True
    best = _deepest(_path_ok(match, anc), depths)
    return best, pred.gather(1, best[:, None])[:, 0]


def typical_accept(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    epsilon: float = 0.09,
    delta: float = 0.3,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa's typical acceptance (NOT lossless): accept x after parent distribution p when
    p(x) > min(epsilon, delta * exp(-H(p))); keep the longest such path; sample the bonus."""
    probs = warp(logits, temperature, top_k, top_p)  # [B, T, V]
    entropy = -(probs * probs.clamp_min(1e-20).log()).sum(-1)  # [B, T]
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * (-entropy).exp())
    p_parent = probs.gather(1, parents[..., None].expand_as(probs))
    p_x = p_parent.gather(2, tokens[..., None])[..., 0]
    match = p_x > threshold.gather(1, parents)
    if valid is not None:
        match &= valid
    match[:, 0] = True
    best = _deepest(_path_ok(match, anc), depths)
    p_best = probs[torch.arange(len(best), device=best.device), best]
    return best, torch.multinomial(p_best, 1)[:, 0]


def sample_accept(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None = None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree rejection sampling for deterministic (top-k) drafts: lossless.

    At the current node with target distribution p, try its children x_1, x_2, ... in order:
    accept x_j with probability p(x_j) / Σp; on rejection set p(x_j) = 0 and go on. If a child
    is accepted, descend and start again with that child's distribution; when every child is
    rejected (or there is none) sample the bonus from what is left of p.

    Why it preserves p: the draft is deterministic (q = δ), so for a token y the chance to emit
    it here is p(y) exactly. If y = x_1: p(x_1). If y = x_j: Π_{i<j}(1 - p'(x_i)) · p'(x_j) where
    p' is p renormalised without x_1..x_{j-1}; the product telescopes to p(x_j). Otherwise y
    comes from the residual with mass 1 - Σ_j p(x_j), again p(y). Descending repeats the
    argument with the child's (correct, target) conditional distribution.
    """
    B, T = tokens.shape
    dev = tokens.device
    rows = torch.arange(B, device=dev)
    probs = warp(logits, temperature, top_k, top_p)  # [B, T, V]
    idx = torch.arange(T, device=dev)
    is_child = (parents[:, None, :] == idx[None, :, None]) & (idx[None, None, :] > 0)  # [B, parent, child]
    if valid is not None:
        is_child &= valid[:, None, :]
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    residual = probs[:, 0].clone()
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    max_depth, max_kids = (int(v) for v in torch.stack([depths.max(), is_child.sum(-1).max()]).tolist())
    for _ in range(max_depth):
        kids = is_child[rows, cur]  # [B, T]
        order = torch.where(kids, idx, T).sort(dim=-1).values  # children of cur, by index
        moved = torch.zeros(B, dtype=torch.bool, device=dev)
        for j in range(max_kids):
            child = order[:, j]
            valid = (child < T) & alive & ~moved
            x = tokens.gather(1, child.clamp(max=T - 1)[:, None])[:, 0]
            px = residual.gather(1, x[:, None])[:, 0] / residual.sum(-1).clamp_min(1e-30)
            u = torch.rand(B, device=dev, generator=generator)
            accept = valid & (u < px)
            reject = valid & ~accept
            kept = residual.gather(1, x[:, None]) * (~reject[:, None])
            residual = residual.scatter(1, x[:, None], kept)
            cur = torch.where(accept, child, cur)
            moved |= accept
        residual = torch.where(moved[:, None], probs[rows, cur], residual)
        alive &= moved
    # the residual keeps mass unless rounding ate it; then the node's own distribution is exact enough
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs[rows, cur])
    bonus = torch.multinomial(residual, 1, generator=generator)
    return cur, bonus[:, 0]
