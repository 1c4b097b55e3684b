"""Conditional-drop sampling: which anchors a P-EAGLE training group trains at which depth.

A P-EAGLE group anchored at row t (the drafter's input pair ``(f_t, x_{t+1})``) has one entry per
depth d = 0 .. K-1: depth 0 reads the real pair and predicts x_{t+2}; depth d >= 1 reads the mask
token and the learned mask feature at position t+d and predicts x_{t+d+2}, attending to the
context (depth 0 at rows <= t) and to its own group's depths < d. Training every anchor at every
depth costs R*K entries; conditional drop keeps depth 0 at every row (the context) and, at depth
d, a random subset of the anchors kept at depth d-1 (a depth-d entry needs its group's depths
1..d-1 to attend to), of geometrically shrinking size::

    seed   = anchors whose depth-0 prediction counts (a random max_anchors of them if more)
    n      = |seed|
    pool_1 = {t : t+1 in seed and depth 1 counts at t}
    pool_d = {t in S_{d-1} : depth d counts at t}                           (d >= 2)
    size_d = floor(max(0, n - d) * max(r**d, r_min))
    S_d    = size_d uniform draws from pool_d without replacement (all of it when smaller)

This is speculators' ``generate_cod_sample_indices`` (its ``models/peagle/data.py``) written in
anchor terms and run per batch row: its depth-d index is the target position o = t + d, its
candidates at depth d are the positions kept at depth d-1 shifted by one, so the anchors
t = o - d are the same sets. Uniforms come from one CPU generator (the global one by default,
saved with training checkpoints), one per (depth, row, position).

The entries of a group pass (:func:`group_entries`) are laid out per batch row as speculators
lays them out: every row at depth 0 first, then depth 1's anchors ascending, depth 2's, ...;
rows with fewer entries are padded (``keep`` False).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DropSampling:
    """The conditional-drop schedule: depth d keeps ``max(ratio**d, ratio_min)`` of the seed
    anchors (speculators' ``down_sample_ratio`` / ``down_sample_ratio_min``, 0.7 / 0.2), from at
    most ``max_anchors`` seeds per batch row (None: all)."""

    ratio: float = 0.7
    ratio_min: float = 0.2
    max_anchors: int | None = None


def depth_sizes(n: torch.Tensor, depths: int, ratio: float, ratio_min: float) -> torch.Tensor:
    """``[depths, B]`` entries kept per depth for ``n [B]`` seed anchors: n at depth 0, then
    ``floor(max(0, n - d) * max(ratio**d, ratio_min))`` (in float64, as Python's ``int(x * r)``)."""
    d = torch.arange(depths, device=n.device)
    share = torch.tensor([max(ratio**i, ratio_min) for i in range(depths)], dtype=torch.float64)
    size = ((n[None] - d[:, None]).clamp(min=0).double() * share.to(n.device)[:, None]).floor().long()
    size[0] = n
    return size


def uniform_pick(pool: torch.Tensor, size: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` bool: per row b, the ``size[b]`` members of ``pool [B, R]`` with the smallest
    uniforms ``u [B, R]`` (a uniform draw without replacement; the whole pool when smaller)."""
    key = torch.where(pool, u, 2.0)
    order = key.argsort(dim=1)
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(pool.shape[1], device=pool.device).expand_as(order)
    )
    return pool & (rank < size[:, None])


def shift_left(x: torch.Tensor, offset: int) -> torch.Tensor:
    """``out[:, t] = x[:, t + offset]`` along dim 1, False past the end."""
    out = torch.zeros_like(x)
    if offset < x.shape[1]:
        out[:, : x.shape[1] - offset] = x[:, offset:]
    return out


def conditional_drop(
    counted: torch.Tensor, sampling: DropSampling, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``chosen [K, B, R]`` from ``counted [K, B, R]`` (counted[d][b, t]: the depth-d prediction of
    anchor t counts): chosen[0] is every row (depth 0 is the context), chosen[d] for d >= 1 the
    anchors trained at depth d (module docstring). Each chosen[d] lies in chosen[d-1] (d >= 2)
    and in counted[d]."""
    K, B, R = counted.shape
    device = counted.device
    u = torch.rand((K, B, R), generator=generator, dtype=torch.float64).to(device)
    seed = counted[0]
    if sampling.max_anchors is not None:
        seed = uniform_pick(seed, torch.full((B,), sampling.max_anchors, device=device), u[0])
    sizes = depth_sizes(seed.sum(1), K, sampling.ratio, sampling.ratio_min)
    chosen = [torch.ones_like(seed)]
    prev = shift_left(seed, 1)
    for d in range(1, K):
        picked = uniform_pick(prev & counted[d], sizes[d], u[d])
        chosen.append(picked)
        prev = picked
    return torch.stack(chosen)


def group_entries(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(anchor, depth, keep)`` each ``[B, N]`` from ``chosen [K, B, R]``: every row at depth 0
    (entries 0 .. R-1, whatever chosen[0] says: the context is always computed), then the chosen
    anchors of depth 1, 2, ... ascending, padded with (anchor 0, depth 0, keep False) to the
    longest row. N = R + the most deeper entries any row has."""
    K, B, R = chosen.shape
    device = chosen.device
    deeper = chosen[1:].permute(1, 0, 2).reshape(B, (K - 1) * R)  # [B, (K-1) R], depth-major
    big = (K - 1) * R
    cols = torch.arange(big, device=device).expand(B, big)
    flat = torch.where(deeper, cols, big).sort(dim=1).values
    flat = flat[:, : int(deeper.sum(1).max()) if big else 0]
    keep = flat < big
    rows = torch.arange(R, device=device).expand(B, R)
    anchor = torch.cat([rows, torch.where(keep, flat % max(R, 1), 0)], 1)
    depth = torch.cat([torch.zeros_like(rows), torch.where(keep, flat // max(R, 1) + 1, 0)], 1)
    return anchor, depth, torch.cat([torch.ones_like(rows, dtype=torch.bool), keep], 1)


def every_depth(rows: torch.Tensor, depths: int) -> torch.Tensor:
    """``chosen [depths, B, R]`` for a group at every anchor of ``rows [B, R]`` and every depth (no
    drop): what evaluation and a decoder compute."""
    return torch.stack([torch.ones_like(rows)] + [rows] * (depths - 1))
