"""Pure tree surgery on a step's :class:`Tree`: keep the best nodes, pad rows, append chains.

Every function keeps the tree invariants: node 0 is the root, parents precede their children,
a node's score never exceeds its parent's, and padding nodes (``valid`` False) hang from the
root, so dropping any set of nodes that is closed under ancestors leaves a tree.
"""

from __future__ import annotations

import torch

from draftheads.decode.tree import Tree


def monotone(scores: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """``min(score, parent's score)`` down the tree: a path is never likelier than its prefix."""
    out = scores.clone()
    for i in range(1, scores.shape[1]):
        out[:, i] = torch.minimum(out[:, i], out.gather(1, parents[:, i : i + 1])[:, 0])
    return out


def prune(tree: Tree, n: int) -> Tree:
    """The root plus each row's ``n`` best-scoring valid nodes (padding when a row has fewer).

    A NaN score ranks lowest, below every valid node, and so does every node under it (each
    node's rank key is the least over its path, found by pointer jumping without reading the
    tree's depth on the host); the root always stays. Keys are thus monotone down the tree and a
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
    up = tree.parents
    for _ in range(max(T - 1, 1).bit_length()):  # key = min over the 2^i nearest ancestors
        key = torch.minimum(key, key.gather(1, up))
        up = up.gather(1, up)
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


def to_rows(tree: Tree) -> list[tuple[list[int], list[int], list[int], list[float]]]:
    """Per-row lists of the valid nodes (padding dropped; valid nodes keep their order)."""
    # one transfer: ids and indices are exact in float64, as are float32 scores
    fields = (tree.tokens, tree.parents, tree.depths, tree.scores, tree.valid)
    host = torch.stack([t.to(torch.float64) for t in fields]).tolist()
    host = [[[int(x) for x in r] for r in host[i]] for i in (0, 1, 2)] + [
        host[3],
        [[bool(x) for x in r] for r in host[4]],
    ]
    rows = []
    for tokens, parents, depths, scores, valid in zip(*host):
        keep = [i for i, v in enumerate(valid) if v]
        index = {old: new for new, old in enumerate(keep)}
        rows.append(
            (
                [tokens[i] for i in keep],
                [index[parents[i]] for i in keep],
                [depths[i] for i in keep],
                [scores[i] for i in keep],
            )
        )
    return rows


def add_chain(
    row: tuple[list[int], list[int], list[int], list[float]], chain: list[int], scores: list[float]
) -> tuple[list[int], list[int], list[int], list[float]]:
    """Append a chain of tokens below the root of one row's tree, sharing existing prefixes.

    Walking down from the root, a chain token that is already a child of the current node
    reuses that node (its score becomes the larger of the two estimates); the rest of the chain
    is appended as new nodes. Returns new lists; the caller restores monotone scores.
    """
    tokens, parents, depths, node_scores = (list(x) for x in row)
    cur = 0
    for tok, s in zip(chain, scores):
        child = next((i for i in range(1, len(tokens)) if parents[i] == cur and tokens[i] == tok), None)
        if child is None:
            tokens.append(tok)
            parents.append(cur)
            depths.append(depths[cur] + 1)
            node_scores.append(s)
            child = len(tokens) - 1
        else:
            node_scores[child] = max(node_scores[child], s)
        cur = child
    return tokens, parents, depths, node_scores
