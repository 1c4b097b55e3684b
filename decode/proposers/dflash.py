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
"""

from __future__ import annotations

import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import block_tree, kv
from draftheads.decode.kv import append_valid
from draftheads.decode.proposers.base import Accepted, Plan, Prefill, Tree
from draftheads.decode.tree import StaticTree


class DFlashProposer:
    needs_hidden_states = True
    passes = 1  # drafter forwards per propose (the decoder's cost model reads it)

    def __init__(self, drafter, static: StaticTree | None, cfg: DecodeConfig) -> None:
        from transformers import DynamicCache

        self.drafter, self.static, self.cfg = drafter, static, cfg
        self.cache = DynamicCache()  # per layer: context keys/values [B, kv_heads, S, D]
        self.valid: torch.Tensor | None = None  # [B, S] slots that hold an accepted position
        self.lengths: torch.Tensor | None = None  # [B] slots each row owns
        self.lengths_cpu: list[int] = []
        self.pending: tuple | None = None  # features not yet in the cache
        self.drafts = drafter.block_size - 1 if static is None else static.depth
        self.topk = min(
            max(static.topk_per_depth()) if static is not None else cfg.top_k_draft,
            drafter.draft_vocab_size,
        )

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
        S, n = kv.seq_length(self.cache), feats.shape[1]
        for i, (k, v) in enumerate(self.drafter.context_kv(feats, positions)):
            self.cache.update(k, v, i)
        new_len = max(a + b for a, b in zip(self.lengths_cpu, n_cpu))
        src = S + torch.arange(n, device=feats.device).expand(len(n_cpu), n)
        kv.compact(self.cache, src, self.lengths[:, None] + src - S, new_len)
        self.valid = append_valid(self.valid, self.lengths, valid, new_len)
        self.lengths = self.lengths + n_keep
        self.lengths_cpu = [a + b for a, b in zip(self.lengths_cpu, n_cpu)]
        self.pending = None

    def context(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's cached context ``(keys, values)``, the pending positions fed first."""
        if self.pending is not None:
            self._feed_pending()
        return [(layer.keys, layer.values) for layer in kv.cache_layers(self.cache)]

    # -- drafting ---------------------------------------------------------------------------
    def block_log_q(self, root: torch.Tensor, pos: torch.Tensor, drafts: int) -> torch.Tensor:
        """The block pass: log q of the tokens at ``pos + 1 .. pos + drafts``, ``[B, drafts, V_draft]``."""
        context = self.context()
        block = self.drafter.block_inputs(root)
        B, T = block.shape
        positions = pos[:, None] + torch.arange(T, device=pos.device)
        # each block row sees its row's valid context and the whole block
        mask = torch.cat(
            [self.valid[:, None, :].expand(B, T, -1), block.new_ones(B, T, T, dtype=torch.bool)], -1
        )
        out = self.drafter(block, positions, context, mask[:, None])
        return self.drafter.logits(out[:, 1 : 1 + drafts]).float().log_softmax(-1)

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        """One block pass, then this step's tree: the static one, or DDTree."""
        top = self.block_log_q(root, pos, self.drafts).topk(self.topk, dim=-1)
        ids = self.drafter.draft_to_target(top.indices)
        B = root.shape[0]
        if self.static is not None:
            tokens, log_scores = block_tree.static_tree(root, top.values, ids, self.static)
            parents, depths = self.static.parents.expand(B, -1), self.static.depths.expand(B, -1)
        else:
            n = self.cfg.total_tokens - 1
            tokens, parents, depths, log_scores = block_tree.best_first(root, top.values, ids, n, self.drafts)
        return Tree(tokens, parents, depths, log_scores.exp(), torch.ones_like(tokens, dtype=torch.bool))

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
