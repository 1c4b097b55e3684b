"""DFlash: one drafter pass over ``[root, mask × (B-1)]`` drafts the whole block.

The drafter's keys and values over the context (the target's features at accepted positions)
depend on those features alone, so they are computed once per accepted position and kept per
layer in the proposer's own cache: after the prefill for the prompt's positions, after each
step for the root and the accepted drafts (positions ``pos .. pos + n_keep - 1``, the ones the
target just read). The block's own entries are never cached: a step's pass attends to the row's
valid context slots and to the whole block (no causal mask). Rows are compacted as the target's
cache is (each row owns slots ``[0, length)``; kv.py), and fed lazily at the next ``propose``
so the decoder counts that work as drafting (or at the next ``update`` when the decoder
verified a step without drafting).

Block row d (1 .. B-1) gives q_d, the draft distribution of the token at ``pos + d``; it does
not depend on the tokens drafted before it. From those, one step's tree is a static choices
tree (``decode.tree=chain`` is the argmax of every position) or, by default, DDTree: the
``total_tokens - 1`` best paths over each position's ``top_k_draft`` candidates, a path scored
by the product of its tokens' marginals (:mod:`draftheads.decode.block_tree`). Node scores are
that product, so the cost-aware planner keeps the nodes that pay; drafting is one pass whatever
the tree (``passes = 1``), so the planner's expansion plan has nothing to decide.

On ``decode.backend=cuda-graphs`` (or with ``graphs`` given) the context lives in
fixed-capacity buffers (a :class:`~draftheads.decode.static.StaticKV` leased from the
drafter's :class:`~draftheads.decode.static.Graphs` pool) with a ``[B, capacity]`` validity
mask: each row's new context entries are scattered at its own length (no compaction), and the
capacity grows outside the drafting call. The block pass and the tree, :func:`draft_tree`, then
run as one captured graph per (batch, capacity, lease, tree shape); without capture the same
function runs eagerly. Feeding the accepted positions' keys/values stays eager (its width is
the accepted path's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import block_tree, kv
from draftheads.decode.kv import append_valid
from draftheads.decode.proposers.base import Accepted, Plan, Prefill, Tree
from draftheads.decode.static import Graphs, StaticKV, drafter_graphs
from draftheads.decode.tree import StaticTree

Context = list[tuple[torch.Tensor, torch.Tensor]]


class DFlashProposer:
    passes = 1  # drafter forwards per propose (the decoder's cost model reads it)

    @classmethod
    def for_drafter(cls, drafter, static: StaticTree | None, cfg: DecodeConfig) -> DFlashProposer:
        """The proposer for ``drafter`` (what :func:`~draftheads.decode.proposers.build_proposer` calls)."""
        return cls(drafter, static, cfg)

    def __init__(
        self, drafter, static: StaticTree | None, cfg: DecodeConfig, graphs: Graphs | None = None
    ) -> None:
        from transformers import DynamicCache

        self.drafter, self.static, self.cfg = drafter, static, cfg
        self.hidden_layers = tuple(drafter.feature_layers())
        if graphs is None and cfg.backend == "cuda-graphs":
            graphs = drafter_graphs(drafter, capture=True)
        self.graphs = graphs  # fixed-capacity context and one captured call per step, when set
        self.cache = DynamicCache()  # per layer: context keys/values [B, kv_heads, S, D]; or a StaticKV
        self.valid: torch.Tensor | None = None  # [B, S] slots that hold an accepted position
        self.lengths: torch.Tensor | None = None  # [B] slots each row owns
        self.lengths_cpu: list[int] = []
        self.pending: tuple | None = None  # features not yet in the cache
        self.drafts = drafter.block_size - 1 if static is None else static.depth
        self.topk, self.n, self.tree = block_tree.tree_setup(static, cfg, drafter.draft_vocab_size)

    # -- the context cache ------------------------------------------------------------------
    def prefill(self, batch: Prefill) -> None:
        B, P = batch.input_ids.shape
        self.valid = torch.zeros(B, 0, dtype=torch.bool, device=batch.valid.device)
        self.lengths = torch.zeros(B, dtype=torch.long, device=batch.valid.device)
        self.lengths_cpu = [0] * B
        feats = self.drafter.select_features(batch.hidden_states)
        self.pending = (feats, batch.positions, batch.valid, torch.full_like(self.lengths, P), [P] * B)

    def update(self, step: Accepted) -> None:
        if self.pending is not None:  # a step the decoder verified without drafting
            self._feed_pending()
        rows = torch.arange(step.path.shape[0], device=step.path.device)[:, None]
        feats = self.drafter.select_features(step.hidden_states)[rows, step.path]
        j = torch.arange(step.path.shape[1], device=step.path.device)[None]
        self.pending = (feats, step.pos[:, None] + j, j < step.n_keep[:, None], step.n_keep, step.n_cpu)

    def _feed_pending(self) -> None:
        """Append the pending positions' context keys/values at each row's own end."""
        feats, positions, valid, n_keep, n_cpu = self.pending
        context = self.drafter.context_kv(feats, positions)
        if self.graphs is not None:
            self._write_fixed(context, valid)
        else:
            self._append_dynamic(context, valid, n_cpu)
        self.lengths = self.lengths + n_keep
        self.lengths_cpu = [a + b for a, b in zip(self.lengths_cpu, n_cpu)]
        self.pending = None

    def _append_dynamic(self, context: Context, valid: torch.Tensor, n_cpu: list[int]) -> None:
        """DynamicCache: append at the physical end, then compact each row's entries to its length."""
        S, n = kv.seq_length(self.cache), valid.shape[1]
        for i, (k, v) in enumerate(context):
            self.cache.update(k, v, i)
        new_len = max(a + b for a, b in zip(self.lengths_cpu, n_cpu))
        src = S + torch.arange(n, device=valid.device).expand(len(n_cpu), n)
        kv.compact(self.cache, src, self.lengths[:, None] + src - S, new_len)
        self.valid = append_valid(self.valid, self.lengths, valid, new_len)

    def _write_fixed(self, context: Context, valid: torch.Tensor) -> None:
        """Fixed-capacity buffers: scatter row b's n entries into slots ``lengths[b] + [0, n)``.

        Entries past a row's kept ones land past its new length, marked invalid (the next write
        overwrites them). The capacity grows here, before any drafting call, never inside one."""
        B, n = valid.shape
        if not isinstance(self.cache, StaticKV):  # the prompt: the lease's buffers, empty
            self.cache = StaticKV(self.graphs.pool, len(context))
            for layer, (k, v) in zip(self.cache.layers, context):
                layer.keys, layer.values = k[:, :, :0], v[:, :, :0]
        cache = self.cache
        cache.ensure(max(self.lengths_cpu) + n)
        slots = self.lengths[:, None] + torch.arange(n, device=valid.device)  # [B, n]
        for layer, (k, v) in zip(cache.layers, context):
            index = slots[:, None, :, None].expand_as(k)
            layer.k_buf.scatter_(2, index, k)
            layer.v_buf.scatter_(2, index, v)
        grown = F.pad(self.valid, (0, cache.capacity - self.valid.shape[1]))
        self.valid = grown.scatter(1, slots, valid)
        cache.set_length(max(self.lengths_cpu) + n)  # the prefix a resize or row selection keeps

    def context(self) -> Context:
        """Every layer's context ``(keys, values)``, the pending positions fed first: the cached
        slots, or the whole fixed-capacity buffers (``self.valid`` spans the same slots)."""
        if self.pending is not None:
            self._feed_pending()
        if isinstance(self.cache, StaticKV):
            return [(layer.k_buf, layer.v_buf) for layer in self.cache.layers]
        return [(layer.keys, layer.values) for layer in kv.cache_layers(self.cache)]

    # -- drafting ---------------------------------------------------------------------------
    def block_log_q(self, root: torch.Tensor, pos: torch.Tensor, drafts: int) -> torch.Tensor:
        """The block pass: log q of the tokens at ``pos + 1 .. pos + drafts``, ``[B, drafts, V_draft]``."""
        return block_log_q(self.drafter, self.context(), self.valid, root, pos, drafts)

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        """One block pass, then this step's tree: the static one, or DDTree."""
        context = self.context()
        if self.graphs is not None:
            tokens, parents, depths, scores = self._propose_fixed(root, pos)
        else:
            tokens, parents, depths, scores = draft_tree(
                self.drafter, context, self.valid, root, pos, self.tree, self.drafts, self.topk, self.n
            )
        return Tree(tokens, parents, depths, scores, torch.ones_like(tokens, dtype=torch.bool))

    def _propose_fixed(self, root: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:func:`draft_tree` over the whole buffers as one fixed-shape call of ``self.graphs``.

        The graph reads the lease's buffers (batch, capacity and lease are in the key) and its
        tensor inputs; the static tree's tensors are inputs too, so a key serves any tree of
        its shape."""
        cache, tree = self.cache, self.tree or ()

        def step(valid, root, pos, *tree):
            context = [(layer.k_buf, layer.v_buf) for layer in cache.layers]
            shape = (self.drafts, self.topk, self.n)
            return draft_tree(self.drafter, context, valid, root, pos, tree or None, *shape)

        size = self.static.size if self.static is not None else 0
        key = ("dflash", root.shape[0], cache.capacity, cache.lease, self.drafts, self.topk, self.n, size)
        return self.graphs.run(key, step, self.valid, root, pos, *tree)

    def select_rows(self, rows: torch.Tensor) -> None:
        kv.select_rows(self.cache, rows)
        self.valid = self.valid.index_select(0, rows)
        self.lengths = self.lengths.index_select(0, rows)
        keep = rows.tolist()
        self.lengths_cpu = [self.lengths_cpu[i] for i in keep]
        if self.pending is not None:
            feats, positions, valid, n_keep, n_cpu = self.pending
            self.pending = (
                feats.index_select(0, rows),
                positions.index_select(0, rows),
                valid.index_select(0, rows),
                n_keep.index_select(0, rows),
                [n_cpu[i] for i in keep],
            )


def block_log_q(
    drafter, context: Context, valid: torch.Tensor, root: torch.Tensor, pos: torch.Tensor, drafts: int
) -> torch.Tensor:
    """The block pass over ``context`` (``[B, kv_heads, S, D]`` per layer, ``valid [B, S]`` the
    slots a row may read): log q of the tokens at ``pos + 1 .. pos + drafts``, ``[B, drafts, V_draft]``."""
    block = drafter.block_inputs(root)
    B, T = block.shape
    positions = pos[:, None] + torch.arange(T, device=pos.device)
    # each block row sees its row's valid context and the whole block
    mask = torch.cat([valid[:, None, :].expand(B, T, -1), block.new_ones(B, T, T, dtype=torch.bool)], -1)
    out = drafter(block, positions, context, mask[:, None])
    return drafter.logits(out[:, 1 : 1 + drafts]).float().log_softmax(-1)


def draft_tree(
    drafter,
    context: Context,
    valid: torch.Tensor,
    root: torch.Tensor,
    pos: torch.Tensor,
    tree: tuple[torch.Tensor, ...] | None,
    drafts: int,
    topk: int,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's draft: the block pass, each position's top-``topk``, then the static ``tree``
    (its parents, depths, ranks and ancestor mask) or DDTree's ``n`` best paths:
    ``(tokens, parents, depths, path probabilities)`` ``[B, T]``.

    Every shape is fixed by (B, slots, drafts, topk, n or the tree's size) and nothing is read on
    the host, so on fixed-capacity buffers it compiles with ``fullgraph=True`` and replays as one
    CUDA graph."""
    top = block_log_q(drafter, context, valid, root, pos, drafts).topk(topk, dim=-1)
    ids = drafter.draft_to_target(top.indices)
    B = root.shape[0]
    if tree is not None:
        parents, depths, ranks, anc = tree
        tokens, log_scores = block_tree.fill_static(root, top.values, ids, depths, ranks, anc)
        parents, depths = parents.expand(B, -1), depths.expand(B, -1)
    else:
        tokens, parents, depths, log_scores = block_tree.best_first(root, top.values, ids, n, drafts)
    return tokens, parents, depths, log_scores.exp()
