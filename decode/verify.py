"""Verification: which path of a drafted tree the target accepts, and the bonus token after it.

Every function takes the target's processed scores (greedy) or sampling probabilities at the
tree nodes ``[B, T, V]`` (node i's give the distribution of the token *after* node i;
:mod:`draftheads.decode.processing` makes them), the tree ``tokens``/``parents``/``depths``
``[B, T]`` and its ancestor mask ``anc [B, T, T]``, and returns ``(best [B], bonus [B])``: the
deepest accepted node (0 = only the root) and the next token.

* :func:`greedy_accept`: lossless for greedy decoding.
* :func:`sample_accept`: lossless for sampling, drawing with one uniform per output position
  (see its proof), so a seed fixes the text whatever the tree.
* :func:`typical_accept`: typical acceptance (Cai et al., 2024). NOT lossless: an explicit opt-in.

``valid [B, T]`` (optional) marks padding nodes False: they are never accepted. :func:`warp` is
the plain batched loop's sampling distribution (temperature, top-k, top-p).
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


def follow(
    pred: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Given the token the target emits after each node, ``pred [B, T]``: the deepest node whose
    every token is its parent's ``pred``, and the ``pred`` after it (the bonus)."""
    match = tokens == pred.gather(1, parents)
    if valid is not None:
        match &= valid
    match[:, 0] = True
    best = _deepest(_path_ok(match, anc), depths)
    return best, pred.gather(1, best[:, None])[:, 0]


def greedy_accept(
    scores: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest path whose every token is the target's argmax after its parent."""
    return follow(scores.argmax(-1), tokens, parents, depths, anc, valid)


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws: per row of ``probs [..., V]``, the first token whose cumulative mass
    exceeds ``u · total`` (``u [...]`` uniform in [0, 1)), so token x comes with probability p(x)."""
    cdf = probs.double().cumsum(-1)
    x = torch.searchsorted(cdf, (u.double() * cdf[..., -1])[..., None], right=True)[..., 0]
    return x.clamp(max=probs.shape[-1] - 1)


def typical_accept(
    probs: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    uniforms: torch.Tensor,
    epsilon: float = 0.09,
    delta: float = 0.3,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Typical acceptance (Cai et al., 2024; NOT lossless): accept x after parent distribution p when
    p(x) > min(epsilon, delta * exp(-H(p))); keep the longest such path; sample the bonus with
    the uniform of its depth (``uniforms [B, D + 1]``, as :func:`sample_accept`)."""
    entropy = -(probs * probs.clamp_min(1e-20).log()).sum(-1)  # [B, T]
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * (-entropy).exp())
    p_parent = probs.gather(1, parents[..., None].expand_as(probs))
    p_x = p_parent.gather(2, tokens[..., None])[..., 0]
    match = p_x > threshold.gather(1, parents)
    if valid is not None:
        match &= valid
    match[:, 0] = True
    best = _deepest(_path_ok(match, anc), depths)
    rows = torch.arange(len(best), device=best.device)
    return best, draw(probs[rows, best], uniforms[rows, depths[rows, best]])


def sample_accept(
    probs: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    uniforms: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree verification for sampling with deterministic (top-k) drafts: lossless, and the text
    depends on the uniforms alone, not on the tree's shape.

    ``probs [B, T, V]``: the target's sampling distribution after each node; ``uniforms
    [B, D + 1]``: column d is the row's uniform for the token after a node at depth d (the
    caller indexes them by output position). Every node draws the token the target emits after
    it, y_i = :func:`draw`(p_i, u[depth_i]); the row descends into the child whose token is y
    and stops at the first node whose draw is none of its children's tokens: that draw is the
    bonus (:func:`follow`, as greedy does with the argmax).

    Why it preserves p: this is tree rejection sampling for q = δ drafts (accept child x_j with
    probability p'(x_j), p' being p renormalised without the children rejected before it, else
    sample the residual). There the chance to descend into x_j is Π_{i<j}(1 - p'(x_i)) · p'(x_j),
    which telescopes to p(x_j), and the residual gives any other y with probability p(y): the
    token emitted after a node is distributed as p, which is what one draw y ~ p does directly.
    Descending repeats the argument with the child's (target) conditional distribution. Since
    the token at each output position is F_p^{-1}(u) for that position's uniform, a seed fixes
    the text whatever tree the planner chooses (up to float rounding of the logits).
    """
    pred = draw(probs, uniforms.gather(1, depths))
    return follow(pred, tokens, parents, depths, anc, valid)
