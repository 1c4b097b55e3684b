"""Pure tree surgery on a step's :class:`Tree`: keep the best nodes, pad rows, append chains,
drop the columns no row uses.

Every function keeps the tree invariants: node 0 is the root, parents precede their children,
a node's score never exceeds its parent's, and padding nodes (``valid`` False) hang from the
root, so dropping any set of nodes that is closed under ancestors leaves a tree.
"""

from __future__ import annotations

import torch

from draftheads.decode.tree import Tree


def monotone(scores: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Each node's least score over its path from the root: a path is never likelier than its
    prefix. Pointer jumping (after step i, the least over a node and its 2^i - 1 nearest
    ancestors; the root is its own parent) takes ⌈log2 T⌉ steps and reads nothing on the host.
    """
    T = scores.shape[1]
    out, up = scores, parents
    for _ in range(max(T - 1, 1).bit_length()):
        out = torch.minimum(out, out.gather(1, up))
        up = up.gather(1, up)
    return out


def prune(tree: Tree, n: int) -> Tree:
    """The root plus each row's ``n`` best-scoring valid nodes (padding when a row has fewer).

    A NaN score ranks lowest, below every valid node, and so does every node under it (each
    node's rank key is the least over its path, :func:`monotone`, so the tree's depth is not
    read on the host); the root always stays. Keys are thus monotone down the tree and a
    stable sort ranks a parent (smaller index) before an equally ranked child, so the kept set is
    closed under ancestors. Kept nodes stay in index order, so parents still precede children;
    parents are re-indexed.
    """
    B, T = tree.tokens.shape
    n = max(0, min(n, T - 1))
    if n == T - 1:
        return tree
    scores = tree.scores.float()
    key = torch.where(tree.valid & ~scores.isnan(), scores, -1.0)
    key[:, 0] = 2.0  # the root always stays
    key = monotone(key, tree.parents)
    keep = key.sort(dim=-1, descending=True, stable=True).indices[:, : n + 1].sort(dim=-1).values
    node_of = torch.zeros(B, T, dtype=torch.long, device=keep.device)
    node_of.scatter_(1, keep, torch.arange(n + 1, device=keep.device).expand(B, -1))
    return Tree(
        tree.tokens.gather(1, keep),
        node_of.gather(1, tree.parents.gather(1, keep)),
        tree.depths.gather(1, keep),
        tree.scores.gather(1, keep),
        tree.valid.gather(1, keep),
    )


def drop_padding(tree: Tree, used: list[bool]) -> Tree:
    """The tree without the columns that are padding in every row: ``used[i]`` (read on the
    host) says whether column i holds a valid node in some row. The root stays; a valid node's
    parent is valid in its row, so its column stays too; parents are re-indexed (a padding node
    hangs from the root, which stays at 0). Nothing is copied when every column is used."""
    cols = [i for i, u in enumerate(used) if u or i == 0]
    if len(cols) == tree.size:
        return tree
    device = tree.tokens.device
    keep = torch.tensor(cols, dtype=torch.long, device=device)
    node_of = torch.zeros(tree.size, dtype=torch.long, device=device)
    node_of[keep] = torch.arange(len(cols), device=device)  # old column -> new column
    return Tree(
        tree.tokens[:, keep],
        node_of[tree.parents[:, keep]],
        tree.depths[:, keep],
        tree.scores[:, keep],
        tree.valid[:, keep],
    )


def from_rows(rows: list[tuple[list[int], list[int], list[int], list[float]]], device) -> Tree:
    """A batch tree from per-row lists ``(tokens, parents, depths, scores)``; shorter rows are
    padded with invalid nodes under the root (token = the root's, never accepted)."""
    T = max(len(r[0]) for r in rows)
    tok, par, dep, sc, val = [], [], [], [], []
    for tokens, parents, depths, scores in rows:
        pad = T - len(tokens)
        tok.append(tokens + [tokens[0]] * pad)
        par.append(parents + [0] * pad)
        dep.append(depths + [1] * pad)
        sc.append(scores + [0.0] * pad)
        val.append([True] * len(tokens) + [False] * pad)
    as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    return Tree(
        as_long(tok),
        as_long(par),
        as_long(dep),
        torch.tensor(sc, dtype=torch.float32, device=device),
        torch.tensor(val, dtype=torch.bool, device=device),
    )


def add_chains(tree: Tree, chains: torch.Tensor, chain_scores: torch.Tensor) -> Tree:
    """Each row's chain of tokens ``chains [B, L]`` (-1 past its end; path scores
    ``chain_scores [B, L]``) below the root, sharing existing prefixes, on the device.

    Walking down from the root, a chain token that is already a valid child of the current node
    reuses that node (the first such child; its score becomes the larger of the two estimates);
    the rest of the chain becomes new nodes ``T, T + 1, ...``, and the tree is ``T + L`` wide
    whatever was shared (the unused columns are padding), so nothing is read on the host. Scores
    are then made :func:`monotone` again.
    """
    B, T = tree.tokens.shape
    L = chains.shape[1]
    at = torch.zeros(B, dtype=torch.long, device=chains.device)  # the node reached; -1: left the tree
    reached = []
    for j in range(L):
        hit = (tree.parents == at[:, None]) & (tree.tokens == chains[:, j, None]) & tree.valid
        hit[:, 0] = False  # the root is its own parent, never a child
        at = torch.where(hit.any(-1), hit.int().argmax(-1), -1)  # argmax: the first hit
        reached.append(at)
    reached = torch.stack(reached, 1)  # [B, L]: shared chain tokens are a prefix
    shared = (reached >= 0).sum(-1)
    lifted = torch.where(reached >= 0, chain_scores.to(tree.scores.dtype), float("-inf"))
    scores = tree.scores.scatter_reduce(1, reached.clamp_min(0), lifted, "amax")
    # new node i is chain token shared + i, under the last shared node (i = 0) or node T + i - 1
    j = shared[:, None] + torch.arange(L, device=chains.device)
    new = (j < L) & (chains.gather(1, j.clamp(max=L - 1)) >= 0)
    j = j.clamp(max=L - 1)
    last = torch.cat([torch.zeros_like(reached[:, :1]), reached], 1).gather(1, shared[:, None])
    below = torch.cat([last, T + torch.arange(L - 1, device=chains.device).expand(B, -1)], 1)
    parents = torch.cat([tree.parents, torch.where(new, below, 0)], 1)
    scores = torch.cat([scores, torch.where(new, chain_scores.gather(1, j).to(scores.dtype), 0.0)], 1)
    return Tree(
        torch.cat([tree.tokens, torch.where(new, chains.gather(1, j), tree.tokens[:, :1])], 1),
        parents,
        torch.cat([tree.depths, torch.where(new, j + 1, 1)], 1),
        monotone(scores, parents),
        torch.cat([tree.valid, new], 1),
    )


def leading_chain(tree: Tree, cap: int) -> Tree:
    """A one-row tree cut to its leading chain of at most ``cap`` nodes: from the root, each node's
    first valid child (the best-ranked, as every proposer orders them). What a target with
    recurrent layers verifies: those read the tree's tokens in order, as one sequence."""
    parents, valid = tree.parents[0].tolist(), tree.valid[0].tolist()
    chain, node = [0], 0
    while len(chain) < cap:
        child = next((i for i in range(node + 1, tree.size) if parents[i] == node and valid[i]), None)
        if child is None:
            break
        chain.append(child)
        node = child
    return drop_padding(tree, [i in chain for i in range(tree.size)])
