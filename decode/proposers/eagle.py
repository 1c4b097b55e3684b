"""EAGLE: the drafter runs autoregressively over the tree with its own KV cache.

The drafter reads pairs (target feature f_t, next token x_{t+1}) at position t. After the
prefill it reads the prompt's features with the tokens shifted by one (the last token being
the root); after each step, the accepted path's features with the tokens that followed them
(the accepted drafts and the bonus). Tree entries are dropped from its cache at the next
step; the accepted pairs stay, compacted per row like the target's.

Trees are EAGLE-2 dynamic trees (expand the ``top_k_draft`` most confident nodes per level,
then keep the ``total_tokens`` most confident overall) or a static tree. A node's score is
the drafter's probability of its path, Π q. With a plan from the decoder, a dynamic tree is
drafted ``plan.depth`` levels deep, a depth the planner set from the previous step's expansion
(:meth:`draftheads.decode.planner.Planner.replan`), so nothing is read on the host while drafting;
the expansion is left in the plan for the decoder to read with the tree's scores.

On ``decode.backend=cuda-graphs`` (or with ``graphs`` given) dynamic trees are drafted at a
fixed depth and top-k (no plan), as SGLang's EAGLE draft runner does: after the accepted pairs
are fed, the drafter's cache moves into fixed-capacity buffers (``StaticKV``) and the whole
expansion, :func:`fixed_tree`, runs as one captured graph per (batch, capacity, lease) through
:class:`draftheads.decode.static.Graphs`; without capture the same function runs eagerly.
"""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import nn

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import dynamic, kv
from draftheads.decode.kv import append_valid
from draftheads.decode.proposers.base import Accepted, Expanded, Plan, Prefill, Tree
from draftheads.decode.static import Graphs, StaticKV, drafter_graphs
from draftheads.decode.tree import StaticTree, ancestor_mask, levels
from draftheads.heads.masks import additive_mask, padded_causal


class PendingPairs:
    """The (feature, next token) pairs a drafter has not read yet: the prompt's at prefill, each
    step's accepted path after it. EAGLE's and P-EAGLE's proposers feed them to their drafter at
    the next proposal (``self.pending``), so a step verified without drafting loses none.

    Steps verified without drafting queue their pairs as they come and the queue is merged once,
    when the drafter next reads it: merged at every step, a run of plain steps after a long
    prompt would copy every pair of the prompt again at each of them."""

    drafter: nn.Module
    unread: list[tuple]  # batches of pairs queued since the drafter last read them

    @property
    def pending(self) -> tuple | None:
        """The unread pairs as one batch (:func:`merge_pending` of the queue), or None."""
        queue = self.__dict__.setdefault("unread", [])
        if len(queue) > 1:
            queue[:] = [merge_pending(*queue)]
        return queue[0] if queue else None

    @pending.setter
    def pending(self, pairs: tuple | None) -> None:
        self.unread = [] if pairs is None else [pairs]

    def prefill(self, batch: Prefill) -> None:
        """The prompt's pairs (its tokens shifted by one, then the root), read at the first proposal."""
        feats = self.drafter.select_features(batch.hidden_states)
        tokens = torch.cat([batch.input_ids[:, 1:], batch.root[:, None]], 1)
        B, P = tokens.shape
        self.valid = torch.zeros(B, 0, dtype=torch.bool, device=tokens.device)
        self.lengths = torch.zeros(B, dtype=torch.long, device=tokens.device)
        self.lengths_cpu = [0] * B
        self.pending = (
            feats,
            tokens,
            batch.valid,
            batch.positions,
            torch.full_like(self.lengths, P),
            [P] * B,
        )

    def update(self, step: Accepted) -> None:
        """This step's accepted path as pairs, read at the next proposal."""
        rows = torch.arange(step.path.shape[0], device=step.path.device)[:, None]
        feats = self.drafter.select_features(step.hidden_states)[rows, step.path]
        j = torch.arange(step.path.shape[1], device=step.path.device)[None]
        new = (feats, step.tokens, j < step.n_keep[:, None], step.pos[:, None] + j, step.n_keep, step.n_cpu)
        # a step verified without drafting left its pairs unread: the next pass reads them all
        self.__dict__.setdefault("unread", []).append(new)

    def select_pending(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` of the batch in the cache bookkeeping and the unread pairs."""
        self.valid = self.valid.index_select(0, rows)
        self.lengths = self.lengths.index_select(0, rows)
        keep = rows.tolist()
        self.lengths_cpu = [self.lengths_cpu[i] for i in keep]
        if self.pending is None:
            return
        feats, tokens, valid, positions, n_keep, n_cpu = self.pending
        self.pending = (
            feats.index_select(0, rows),
            tokens.index_select(0, rows),
            valid.index_select(0, rows),
            positions.index_select(0, rows),
            n_keep.index_select(0, rows),
            [n_cpu[i] for i in keep],
        )


class EagleProposer(PendingPairs):
    @classmethod
    def for_drafter(cls, drafter, static: StaticTree | None, cfg: DecodeConfig) -> EagleProposer:
        """The proposer for ``drafter`` (what :func:`~draftheads.decode.proposers.build_proposer` calls)."""
        return cls(drafter, static, cfg)

    def __init__(
        self, drafter, static: StaticTree | None, cfg: DecodeConfig, graphs: Graphs | None = None
    ) -> None:
        from transformers import DynamicCache

        self.drafter, self.static, self.cfg = drafter, static, cfg
        self.hidden_layers = tuple(drafter.feature_layers())
        if graphs is None and static is None and cfg.backend == "cuda-graphs":
            graphs = drafter_graphs(drafter, capture=True)
        self.graphs = graphs if static is None else None  # fixed-shape drafting of dynamic trees
        self.cache = DynamicCache()  # a StaticKV once the prompt is read, when drafting is fixed-shape
        self.valid: torch.Tensor | None = None  # [B, S] stable slots that hold a real pair
        self.lengths: torch.Tensor | None = None
        self.lengths_cpu: list[int] = []
        self.pending: tuple | None = None
        self.passes = 0  # drafter forwards in the last propose (the decoder's cost model reads it)
        if static is not None:
            self.anc = ancestor_mask(static.parents, static.depth)
            self.topk = static.topk_per_depth()
            self.parents, self.levels = static.parents.tolist(), levels(static, self.anc)

    def _feed_pending(self) -> torch.Tensor:
        """Run the drafter on the pending pairs; keep them in its cache; return the root's output."""
        feats, tokens, valid, positions, n_keep, n_cpu = self.pending
        S = self.cache.get_seq_length()
        n = tokens.shape[1]
        if isinstance(self.cache, StaticKV):  # write at [S, S + n), attend over those slots only
            self.cache.ensure(S + n + self.tree_slots())
            self.cache.write_index = torch.arange(S, S + n, device=tokens.device)
            self.cache.span = S + n
        allowed = padded_causal(valid)
        mask = additive_mask(torch.cat([self.valid[:, None, :].expand(-1, n, -1), allowed], -1), feats.dtype)
        out = self.drafter(tokens, self.drafter.fuse(feats), positions, mask, self.cache)
        if isinstance(self.cache, StaticKV):
            self.cache.set_length(S + n)  # as a DynamicCache would have grown
        new_len = max(a + b for a, b in zip(self.lengths_cpu, n_cpu))
        src = S + torch.arange(n, device=tokens.device).expand(len(n_cpu), n)
        kv.compact(self.cache, src, self.lengths[:, None] + src - S, new_len)
        self.valid = append_valid(self.valid, self.lengths, valid, new_len)
        self.lengths = self.lengths + n_keep
        self.lengths_cpu = [a + b for a, b in zip(self.lengths_cpu, n_cpu)]
        if self.graphs is not None and not isinstance(self.cache, StaticKV):
            self.cache = StaticKV.adopt(self.cache, self.graphs.pool, self.tree_slots())
        self.pending = None
        rows = torch.arange(out.shape[0], device=out.device)
        return out[rows, n_keep - 1]

    def tree_slots(self) -> int:
        """Drafter cache slots a fixed-shape expansion writes after the committed ones."""
        return (self.cfg.depth - 1) * self.cfg.top_k_draft

    def _feed_tree(self, tokens, hidden, positions, anc_fed) -> torch.Tensor:
        """Run the drafter on new tree nodes; ``anc_fed [B, n, F]`` = their ancestors among the
        tree nodes fed so far, themselves last. Their KV stays until the next step truncates it."""
        n = tokens.shape[1]
        mask = additive_mask(torch.cat([self.valid[:, None, :].expand(-1, n, -1), anc_fed], -1), hidden.dtype)
        self.passes += 1
        return self.drafter(tokens, hidden, positions, mask, self.cache)

    def _log_q(self, out: torch.Tensor) -> torch.Tensor:
        return self.drafter.logits(out).float().log_softmax(-1)

    # -- drafting ---------------------------------------------------------------------------
    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        self.cache.crop(self.valid.shape[1] - self.cache.get_seq_length())  # drop last step's tree
        self.passes = 1
        h_root = self._feed_pending()
        if self.static is not None:
            return self._propose_static(root, pos, h_root)
        if self.graphs is not None:
            return self._propose_fixed(root, pos, h_root)
        return self._propose_dynamic(root, pos, h_root, plan)

    def _propose_fixed(self, root: torch.Tensor, pos: torch.Tensor, h_root: torch.Tensor) -> Tree:
        """EAGLE-2 at the caps (``depth`` levels of ``top_k_draft``), as one fixed-shape call."""
        cache, (k, depth, n) = self.cache, (self.cfg.top_k_draft, self.cfg.depth, self.cfg.total_tokens - 1)
        S, C = cache.get_seq_length(), cache.capacity
        cache.ensure(S + self.tree_slots())
        cache.span = None
        B = root.shape[0]
        valid = torch.zeros(B, C, dtype=torch.bool, device=root.device)
        valid[:, :S] = self.valid
        base = torch.full((), S, dtype=torch.long, device=root.device)
        self.passes = depth

        def expand(valid, base, root, pos, h_root):
            return fixed_tree(self.drafter, cache, valid, base, root, pos, h_root, k, depth, n)

        key = ("eagle", B, C, cache.lease, k, depth, n)
        tokens, parents, depths, scores = self.graphs.run(key, expand, valid, base, root, pos, h_root)
        return Tree(tokens, parents, depths, scores, torch.ones_like(tokens, dtype=torch.bool))

    def _propose_dynamic(
        self, root: torch.Tensor, pos: torch.Tensor, h_root: torch.Tensor, plan: Plan | None
    ) -> Tree:
        """EAGLE-2: expand the top_k most confident nodes level by level, rerank to total_tokens.

        ``plan.depth`` levels (``depth`` without a plan or before the planner has set one); with a
        plan, every candidate's score and each level's frontier go to ``plan.expanded``.
        """
        k, cap, n = self.cfg.top_k_draft, self.cfg.depth, self.cfg.total_tokens - 1
        depth = cap if plan is None or plan.depth is None else max(1, min(plan.depth, cap))
        B = root.shape[0]
        grown = dynamic.Expansion(self._log_q(h_root), h_root, k)
        frontiers = [grown.frontier_scores()]
        for d in range(1, depth):
            front_ids = self.drafter.draft_to_target(grown.frontier_ids())
            new_anc = grown.frontier_ancestors()
            out = self._feed_tree(front_ids, grown.front_hidden, (pos + d - 1)[:, None].expand(B, k), new_anc)
            grown.grow(self._log_q(out), out, new_anc, d + 1)
            frontiers.append(grown.frontier_scores())
        if plan is not None:
            counts = list(accumulate(s.shape[1] for s in grown.scores))
            plan.expanded = Expanded(grown.all_scores().exp(), torch.stack(frontiers, 1).exp(), counts, cap)
        tokens, tparents, tdepths, tscores = grown.tree(root, self.drafter.draft_to_target, n)
        return Tree(tokens, tparents, tdepths, tscores.exp(), torch.ones_like(tokens, dtype=torch.bool))

    def _propose_static(self, root: torch.Tensor, pos: torch.Tensor, h_root: torch.Tensor) -> Tree:
        """A static tree: level by level, take each parent's top-k, feed the nodes that have children."""
        st, lv = self.static, self.levels
        B, dev = root.shape[0], root.device
        tokens = torch.zeros(B, st.size, dtype=torch.long, device=dev)
        scores = torch.ones(B, st.size, dtype=torch.float32, device=dev)
        outs = torch.zeros(B, st.size, h_root.shape[-1], dtype=h_root.dtype, device=dev)
        outs[:, 0] = h_root
        for d, (nodes, par, par_slot, ranks, feed, anc_fed) in enumerate(lv, start=1):
            top = self._log_q(outs[:, par]).topk(self.topk[d - 1], dim=-1)  # [B, parents, k]
            tokens[:, nodes] = self.drafter.draft_to_target(top.indices[:, par_slot, ranks])
            parent_nodes = [self.parents[i] for i in nodes]
            scores[:, nodes] = scores[:, parent_nodes] * top.values[:, par_slot, ranks].exp()
            if feed:
                hidden = outs[:, [self.parents[i] for i in feed]]
                positions = (pos + d - 1)[:, None].expand(B, len(feed))
                outs[:, feed] = self._feed_tree(tokens[:, feed], hidden, positions, anc_fed.expand(B, -1, -1))
        tokens[:, 0] = root
        return Tree(
            tokens,
            st.parents.expand(B, -1),
            st.depths.expand(B, -1),
            scores,
            torch.ones_like(tokens, dtype=torch.bool),
        )

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.select_pending(rows)


def merge_pending(*batches: tuple) -> tuple:
    """Batches of pending pairs as one: each row's kept pairs of the first batch (its first
    ``n_keep``), then those of the next, and so on, then the rest in their order (dropped by the
    feed's compaction)."""
    late = sum(t.shape[1] for _, t, *_ in batches)  # sorts after every kept pair
    keys, before = [], torch.zeros_like(batches[0][4])
    for _, t, _, _, n_keep, _ in batches:
        j = torch.arange(t.shape[1], device=t.device)[None]
        keys.append(torch.where(j < n_keep[:, None], before[:, None] + j, late))
        before = before + n_keep
    order = torch.cat(keys, 1).argsort(dim=1, stable=True)

    def take(field: int) -> torch.Tensor:
        both = torch.cat([b[field] for b in batches], 1)
        index = order.view(*order.shape, *([1] * (both.dim() - 2))).expand(-1, -1, *both.shape[2:])
        return both.gather(1, index)

    counts = [sum(row) for row in zip(*(b[5] for b in batches))]
    return (take(0), take(1), take(2), take(3), before, counts)


def fixed_tree(
    drafter,
    cache: StaticKV,
    valid: torch.Tensor,
    base: torch.Tensor,
    root: torch.Tensor,
    pos: torch.Tensor,
    h_root: torch.Tensor,
    k: int,
    depth: int,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An EAGLE-2 dynamic tree of exactly ``depth`` levels of ``k`` children, reranked to the ``n``
    best nodes plus the root: ``(tokens, parents, depths, path probabilities)`` ``[B, n + 1]``.

    Every shape is fixed by (B, k, depth, n, capacity) and nothing is read on the host, so it
    compiles with ``fullgraph=True`` and replays as one CUDA graph. ``valid [B, C]``: the
    committed drafter slots; ``base``: the first free slot (a 0-d tensor, so the graph does not
    depend on it). Level d's k nodes are written at slots ``base + (d-1)k + [0, k)`` and see the
    committed slots and their ancestors among the levels written before them.
    """
    B, C = valid.shape
    dev = root.device
    grown = dynamic.Expansion(drafter.logits(h_root).float().log_softmax(-1), h_root, k)
    for d in range(1, depth):
        front_ids = drafter.draft_to_target(grown.frontier_ids())
        new_anc = grown.frontier_ancestors()  # [B, k, d*k]: ancestors and self
        slots = base + torch.arange(d * k, device=dev)
        tree_cols = torch.zeros(B, k, C, dtype=torch.bool, device=dev).scatter(
            2, slots.expand(B, k, d * k), new_anc
        )
        cache.write_index = slots[-k:]
        mask = additive_mask(valid[:, None, :] | tree_cols, h_root.dtype)
        out = drafter(front_ids, grown.front_hidden, (pos + d - 1)[:, None].expand(B, k), mask, cache)
        grown.grow(drafter.logits(out).float().log_softmax(-1), out, new_anc, d + 1)
    tokens, tparents, tdepths, tscores = grown.tree(root, drafter.draft_to_target, n)
    return tokens, tparents, tdepths, tscores.exp()
