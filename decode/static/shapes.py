"""The fixed shapes of the static verify path, and the masks over them.

A CUDA graph replays fixed kernels on fixed shapes, so the verify forward pads what varies
from step to step: a tree of T nodes to the next bucket size (1, 2, 4, ..., 64) with invalid
nodes under the root, and the KV cache to a power-of-two capacity. The masks are built on the
device from the tree's parents, with no host read of its depth (a graph cannot read one).
"""

from __future__ import annotations

import torch

from draftheads.decode.kv import slot_positions
from draftheads.decode.tree import Tree
from draftheads.heads.masks import additive_mask, target_attention_mask

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_CAPACITY = 256


def bucket(n: int) -> int:
    """The padded tree size for ``n`` nodes: the next bucket, or the next multiple of 64 past them."""
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // BUCKETS[-1]) * BUCKETS[-1]


def capacity_for(n: int) -> int:
    """Cache slots for ``n`` tokens: the next power of two, at least ``MIN_CAPACITY``."""
    c = MIN_CAPACITY
    while c < n:
        c *= 2
    return c


def pad_tree(tree: Tree, size: int) -> Tree:
    """``tree`` with invalid nodes appended under the root up to ``size`` nodes (token = root's)."""
    B, T = tree.tokens.shape
    pad = size - T
    if pad <= 0:
        return tree
    col = lambda t, v: torch.full((B, pad), v, dtype=t.dtype, device=t.device)  # noqa: E731
    return Tree(
        torch.cat([tree.tokens, tree.tokens[:, :1].expand(B, pad)], 1),
        torch.cat([tree.parents, col(tree.parents, 0)], 1),
        torch.cat([tree.depths, col(tree.depths, 1)], 1),
        torch.cat([tree.scores, col(tree.scores, 0.0)], 1),
        torch.cat([tree.valid, col(tree.valid, False)], 1),
    )


def pad_ancestors(anc: torch.Tensor, size: int) -> torch.Tensor:
    """``[B, T, T]`` ancestor mask grown to ``size`` nodes: a padding node sees the root and itself."""
    B, T, _ = anc.shape
    out = torch.zeros(B, size, size, dtype=torch.bool, device=anc.device)
    out[:, :T, :T] = anc
    i = torch.arange(T, size, device=anc.device)
    out[:, i, 0] = True
    out[:, i, i] = True
    return out


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """``anc[.., i, j]``: node j is node i or one of its ancestors (as ``tree.ancestor_mask``),
    without reading the tree's depth on the host. With P the parent relation (the root has
    none), R = I | P squared ceil(log2(T - 1)) times reaches along every path of up to T - 1
    edges, the deepest a T-node tree has."""
    T = parents.shape[-1]
    idx = torch.arange(T, device=parents.device)
    reach = ((parents[..., :, None] == idx) & (idx[:, None] > 0)) | (idx[:, None] == idx)
    for _ in range(max(T - 1, 1).bit_length()):
        r = reach.float()
        reach = (r @ r) > 0
    return reach


def static_mask(
    kv_valid: torch.Tensor,
    anc: torch.Tensor,
    capacity: int,
    dtype: torch.dtype,
    config=None,
    q_pos: torch.Tensor | None = None,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive ``[B, 1, T, capacity]``: the row's valid cache slots, then the tree's ancestors
    at slots ``[S, S + T)``; every other slot is masked. With the target's ``config`` and the
    tree's positions ``q_pos [B, T]``, each layer kind keeps its own window
    (:func:`~draftheads.heads.masks.target_attention_mask`, as the dynamic path)."""
    B, T, _ = anc.shape
    S = kv_valid.shape[1]
    allowed = torch.zeros(B, T, capacity, dtype=torch.bool, device=anc.device)
    allowed[:, :, :S] = kv_valid[:, None, :]
    allowed[:, :, S : S + T] = anc
    if config is None or q_pos is None:
        return additive_mask(allowed, dtype)
    k_pos = torch.zeros(B, capacity, dtype=torch.long, device=anc.device)
    k_pos[:, :S] = slot_positions(kv_valid)
    k_pos[:, S : S + T] = q_pos
    return target_attention_mask(config, allowed, q_pos, k_pos, dtype)
