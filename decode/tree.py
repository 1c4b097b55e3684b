"""Token trees as tensors: choices -> buffers, ancestor masks, accepted paths, tree search.

A tree of ``T`` nodes is three integer tensors, node 0 being the root (the last emitted token,
not yet in the target's KV cache) and every parent listed before its children:

* ``parents [.., T]``: index of each node's parent (the root is its own parent);
* ``depths  [.., T]``: 0 for the root; a node at depth d sits at position ``pos(root) + d``;
* ``ranks   [.., T]``: which top-k candidate of its parent's draft distribution the node takes.

A static tree is given in the *choices* format of Cai et al., 2024: a list of paths of per-depth top-k ranks,
``[[0], [1], [0, 0]]`` = {head0 top-1, head0 top-2, head0 top-1 -> head1 top-1}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.kinds import drafter_kind

TREE_FILE = "tree.json"

# Per-head per-rank accuracies measured on SmolLM2 (docs: smollm2-measurements, in domain);
# used to shape a tree when no measured tree.json exists. Rank r of head k is assumed to be
# right with probability top1[k] * 0.45**r (a rough fit of the curves Cai et al., 2024 published).
PRIOR_TOP1 = [0.41, 0.23, 0.16, 0.12, 0.09, 0.07, 0.05, 0.04]


@dataclass
class Tree:
    """One step's tree for every active row, ``[B, T]`` tensors, node 0 the root.

    Parents precede their children. ``scores`` estimates the chance that the target accepts
    the node's whole path (1 for the root; never above the parent's). ``valid`` is False for
    padding nodes (rows of a batch may have fewer nodes): they are verified but never accepted.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    valid: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())


@dataclass(frozen=True)
class StaticTree:
    """A static tree (choices) and its buffers, shared by every row of a batch."""

    choices: tuple[tuple[int, ...], ...]
    parents: torch.Tensor  # [T] long
    depths: torch.Tensor  # [T] long
    ranks: torch.Tensor  # [T] long

    @property
    def size(self) -> int:
        """Tokens verified per step, the root included."""
        return int(self.parents.numel())

    @property
    def depth(self) -> int:
        return int(self.depths.max())

    def topk_per_depth(self) -> list[int]:
        """How many candidates each depth needs from its draft distribution: max rank + 1."""
        return [int(self.ranks[self.depths == d].max()) + 1 for d in range(1, self.depth + 1)]

    def to(self, device: torch.device) -> StaticTree:
        return StaticTree(
            self.choices, self.parents.to(device), self.depths.to(device), self.ranks.to(device)
        )


def validate_choices(choices: list[list[int]], num_heads: int | None = None) -> list[tuple[int, ...]]:
    """Check a choices list and return it sorted by (depth, path); raise a one-line UserError."""
    try:
        paths = [tuple(int(r) for r in c) for c in choices]
    except (TypeError, ValueError):
        raise UserError(
            f"tree {str(choices)[:60]} is not a list of rank paths like [[0], [1], [0, 0]]; fix decode.tree"
        ) from None
    if not paths:
        raise UserError("decode.tree is empty; give at least one path such as [[0]]")
    seen = set(paths)
    for p in paths:
        if not p or min(p) < 0:
            raise UserError(f"decode.tree path {list(p)} must be a non-empty list of ranks >= 0")
        if num_heads is not None and len(p) > num_heads:
            raise UserError(
                f"decode.tree path {list(p)} has depth {len(p)} but the drafter has {num_heads} heads; "
                f"use paths of at most {num_heads} ranks"
            )
        if len(p) > 1 and p[:-1] not in seen:
            raise UserError(f"decode.tree path {list(p)} has no parent {list(p[:-1])}; add it to the tree")
    if len(seen) != len(paths):
        raise UserError("decode.tree lists a path twice; remove the duplicate")
    return sorted(paths, key=lambda p: (len(p), p))


def tree_from_choices(choices: list[list[int]], num_heads: int | None = None) -> StaticTree:
    """Buffers of a choices tree: node i+1 is path i (sorted by depth then ranks), node 0 the root."""
    paths = validate_choices(choices, num_heads)
    index = {p: i + 1 for i, p in enumerate(paths)}
    parents = [0] + [index[p[:-1]] if len(p) > 1 else 0 for p in paths]
    depths = [0] + [len(p) for p in paths]
    ranks = [0] + [p[-1] for p in paths]
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return StaticTree(tuple(paths), as_long(parents), as_long(depths), as_long(ranks))


def chain(depth: int) -> list[list[int]]:
    """The top-1 chain of ``depth`` draft tokens."""
    return [[0] * d for d in range(1, depth + 1)]


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``anc[.., i, j]`` is True when node j is node i or one of its ancestors.

    With P the one-hot parent matrix (root excluded), anc = I + P + P^2 + ... + P^max_depth.
    """
    T = parents.shape[-1]
    eye = torch.eye(T, dtype=torch.bool, device=parents.device).expand(*parents.shape, T)
    P = torch.nn.functional.one_hot(parents, T).to(torch.float32)
    P[..., 0, :] = 0  # the root has no parent
    reach, step = eye.clone(), eye.to(torch.float32)
    for _ in range(max_depth):
        step = step @ P
        reach |= step > 0
    return reach


def levels(static: StaticTree, anc: torch.Tensor) -> list[tuple]:
    """How to draft a static tree level by level. Per depth d: (its nodes, their parents, each
    node's slot among those parents, the nodes' ranks, the nodes that have children and so must
    be fed to an autoregressive drafter, and those fed nodes' ancestor mask over every node fed
    up to then)."""
    parents, depths, ranks = static.parents.tolist(), static.depths.tolist(), static.ranks.tolist()
    has_kids, fed, out = set(parents[1:]), [], []
    for d in range(1, static.depth + 1):
        nodes = [i for i in range(1, static.size) if depths[i] == d]
        par = sorted({parents[i] for i in nodes})
        feed = [i for i in nodes if i in has_kids]
        fed += feed
        idx = torch.tensor(fed, dtype=torch.long, device=anc.device)
        anc_fed = anc[idx][:, idx][len(fed) - len(feed) :]
        out.append(
            (nodes, par, [par.index(parents[i]) for i in nodes], [ranks[i] for i in nodes], feed, anc_fed)
        )
    return out


def path_nodes(anc: torch.Tensor, best: torch.Tensor, length: int) -> torch.Tensor:
    """Node indices from the root down to ``best`` [B], left-aligned and padded to ``length``.

    Ancestors have smaller indices than descendants, so sorting the indices of ``anc[b, best]``
    lists the path in depth order; padding repeats ``best`` (never read as part of the path).
    """
    B, T, _ = anc.shape
    row = anc[torch.arange(B, device=anc.device), best]  # [B, T]
    idx = torch.arange(T, device=anc.device).expand(B, T)
    order = torch.where(row, idx, T).sort(dim=-1).values[:, :length]
    return torch.where(order < T, order, best[:, None])


# ---- tree search (Cai et al., 2024, Appendix C) ------------------------------------------------
def prior_accuracies(num_heads: int, topk: int = 10) -> list[list[float]]:
    """Assumed accuracy of rank r of head k when nothing was measured (see PRIOR_TOP1)."""
    top1 = [PRIOR_TOP1[min(k, len(PRIOR_TOP1) - 1)] for k in range(num_heads)]
    return [[t * 0.45**r for r in range(topk)] for t in top1]


def path_scores(acc: list[list[float]], max_nodes: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every path's score Π_d acc[d][r_d] (the chance it is accepted, heads independent),
    best first; ties favour the shallower path so a parent always precedes its children."""
    scores: list[tuple[float, tuple[int, ...]]] = []
    frontier = [(1.0, ())]
    for d in range(len(acc)):
        nxt = [(s * acc[d][r], p + (r,)) for s, p in frontier for r in range(len(acc[d]))]
        # a path that is not among the best max_nodes can have no child among them either
        nxt = sorted(nxt, key=lambda x: -x[0])[:max_nodes]
        scores += nxt
        frontier = nxt
    return sorted(scores, key=lambda x: (-x[0], len(x[1]), x[1]))


def best_tree(acc: list[list[float]], num_nodes: int) -> list[list[int]]:
    """The ``num_nodes``-node tree (root excluded) with the largest expected accepted length.

    Expected tokens per step = 1 + Σ_nodes Π acc (a node is on the accepted path with that
    probability), so the best tree holds the best-scoring paths. Greedy expansion as in Cai et al., 2024:
    add the best path whose parent is already in the tree.
    """
    chosen: list[tuple[int, ...]] = []
    have: set[tuple[int, ...]] = {()}
    for _, p in path_scores(acc, max(num_nodes, 1)):
        if len(chosen) == num_nodes:
            break
        if p[:-1] in have:
            chosen.append(p)
            have.add(p)
    return [list(p) for p in sorted(chosen, key=lambda p: (len(p), p))]


def expected_tokens(acc: list[list[float]], choices: list[list[int]]) -> float:
    """1 + Σ_nodes Π_d acc[d][r_d]: expected tokens per step (bonus included), heads independent."""
    total = 1.0
    for c in choices:
        s = 1.0
        for d, r in enumerate(c):
            s *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
        total += s
    return total


def parse_tree(spec: str, num_heads: int | None) -> list[list[int]] | None:
    """``decode.tree``: ``auto`` (None), ``chain`` or ``chainN``, a JSON list, or a JSON file."""
    if spec in ("auto", "", None):
        return None
    if spec.startswith("chain"):
        n = spec[5:]
        depth = int(n) if n.isdigit() else (num_heads or 4)
        return chain(depth)
    if spec.lstrip().startswith("["):
        try:
            return json.loads(spec)
        except json.JSONDecodeError as e:
            raise UserError(
                f"decode.tree={spec[:40]} is not valid JSON ({e}); use e.g. [[0],[1],[0,0]]"
            ) from None
    path = Path(spec).expanduser()
    if not path.is_file():
        raise UserError(
            f"decode.tree={spec}: no such file; use auto, chain, a JSON list like [[0],[0,0]] or a tree.json path"
        )
    return load_tree_file(path)


def load_tree_file(path: Path) -> list[list[int]]:
    """Read a ``tree.json`` (``{"choices": [...], ...}`` or a bare list)."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); rebuild it with draftheads tree") from None
    choices = data.get("choices") if isinstance(data, dict) else data
    if not isinstance(choices, list):
        raise UserError(f"{path} has no 'choices' list; rebuild it with draftheads tree")
    return choices


def drafter_tree(drafter, cfg, tree_dir: str | None, device: torch.device) -> StaticTree | None:
    """The static tree a drafter decodes with (None: a drafter that drafts trees as it goes, with
    ``dynamic`` on, builds its own: dynamic trees (Li et al., 2024) or DDTree), from
    ``decode.tree``: a spec, else a tree.json beside the heads, else a default (heads that index
    a static tree by depth: the best tree of ``total_tokens`` for prior accuracies; any other
    drafter: a chain of its ``draft_depth``, else of ``decode.depth``).

    The drafter says what shapes its trees (``Drafter.tree_width``, ``draft_depth``,
    ``dynamic_trees``); its kind is never tested by name here."""
    drafter_kind(getattr(drafter, "kind", ""))  # a known kind, or one clear error
    num_heads = drafter.tree_width()  # heads a static tree's depths index (None: any depth)
    block = drafter.draft_depth()  # the most tokens one draft reaches (None: no limit)
    choices = parse_tree(cfg.tree, num_heads or block)
    directory = tree_dir or getattr(drafter, "source_dir", None)
    if choices is None and directory is not None:
        f = Path(directory) / TREE_FILE
        choices = load_tree_file(f) if f.is_file() else None
    if choices is None and drafter.dynamic_trees and cfg.dynamic:
        if cfg.top_k_draft < 1 or cfg.depth < 1 or cfg.total_tokens < 2:
            raise UserError(
                f"decode.top_k_draft={cfg.top_k_draft}, depth={cfg.depth}, total_tokens={cfg.total_tokens}: "
                "need top_k_draft >= 1, depth >= 1 and total_tokens >= 2"
            )
        return None
    if choices is None:
        if num_heads is not None:
            choices = best_tree(prior_accuracies(num_heads), max(cfg.total_tokens - 1, 1))
        else:
            choices = chain(block or cfg.depth)
    if block is not None:
        deepest = max(map(len, validate_choices(choices)))
        if deepest > block:
            raise UserError(
                f"decode.tree drafts {deepest} tokens deep but {drafter.depth_limit()}; use a tree "
                f"of at most {block} levels (decode.tree=chain drafts all {block})"
            )
    return tree_from_choices(choices, num_heads).to(device)
