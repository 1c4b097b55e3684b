"""P-EAGLE: one drafter pass after the accepted pairs drafts a whole group.

The drafter reads pairs (target feature f_t, next token x_{t+1}) at position t and keeps them
in its own cache, compacted per row like the target's, exactly as EAGLE's proposer does
(:mod:`draftheads.decode.proposers.eagle`): after the prefill the prompt's features with the
tokens shifted by one (the last token being the root), after each step the accepted path's
features with the tokens that followed them. Each ``propose`` reads the pending pairs and the
group's ``k - 1`` mask entries in the same forward
(:func:`~draftheads.heads.peagle.draft.parallel_draft`)::

    q_1 .. q_k = the group anchored at the root's pair          (one drafter pass)

q_d is the draft distribution of the token d after the root; it does not read the tokens
drafted before it (the group is parallel), so a step's tree is built as DFlash's block is
(:mod:`draftheads.decode.block_tree`): a static choices tree at most ``num_depths`` deep
(``decode.tree=chainK`` with K = ``num_depths``: every depth's argmax) or DDTree, the ``total_tokens - 1`` best paths over each position's
``top_k_draft`` candidates scored by the product of marginals. Node scores are that product,
so the cost-aware planner keeps the nodes that pay; drafting is one pass whatever the tree
(``passes = 1``). The mask entries never stay in the cache. Fixed-shape drafting
(``decode.backend=cuda-graphs``) is not implemented: drafting runs eagerly.
"""

from __future__ import annotations

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import block_tree, kv
from draftheads.decode.kv import append_valid
from draftheads.decode.proposers.base import Plan, Tree
from draftheads.decode.proposers.eagle import PendingPairs
from draftheads.decode.tree import StaticTree
from draftheads.heads.peagle.draft import parallel_draft


class PEagleProposer(PendingPairs):
    passes = 1  # drafter forwards per propose (the decoder's cost model reads it)

    @classmethod
    def for_drafter(cls, drafter, static: StaticTree | None, cfg: DecodeConfig) -> PEagleProposer:
        """The proposer for ``drafter`` (what :func:`~draftheads.decode.proposers.build_proposer` calls)."""
        return cls(drafter, static, cfg)

    def __init__(self, drafter, static: StaticTree | None, cfg: DecodeConfig) -> None:
        from transformers import DynamicCache

        self.drafter, self.static, self.cfg = drafter, static, cfg
        self.hidden_layers = tuple(drafter.feature_layers())
        self.cache = DynamicCache()  # the accepted pairs' keys/values, per row [0, length)
        self.valid: torch.Tensor | None = None  # [B, S] slots that hold a real pair
        self.lengths: torch.Tensor | None = None
        self.lengths_cpu: list[int] = []
        self.pending: tuple | None = None  # pairs not yet read by the drafter
        self.drafts = drafter.num_depths if static is None else static.depth
        if self.drafts > drafter.num_depths:
            raise UserError(
                f"decode.tree drafts {self.drafts} tokens deep but the P-EAGLE drafter was trained for groups "
                f"of {drafter.num_depths}; use a tree of at most {drafter.num_depths} levels "
                f"(decode.tree=chain{drafter.num_depths} drafts the whole group)"
            )
        self.topk, self.n, self.tree = block_tree.tree_setup(static, cfg, drafter.draft_vocab_size)

    def group_log_q(self) -> torch.Tensor:
        """Read the pending pairs and draft the group in one pass; keep the pairs in the cache.
        Returns log q of the ``drafts`` tokens after the root, ``[B, drafts, V_draft]``."""
        feats, tokens, valid, positions, n_keep, n_cpu = self.pending
        S, n = kv.seq_length(self.cache), tokens.shape[1]
        out = parallel_draft(
            self.drafter, feats, tokens, positions, valid, self.drafts, self.valid, self.cache
        )
        new_len = max(a + b for a, b in zip(self.lengths_cpu, n_cpu))
        src = S + torch.arange(n, device=tokens.device).expand(len(n_cpu), n)
        kv.compact(self.cache, src, self.lengths[:, None] + src - S, new_len)
        self.valid = append_valid(self.valid, self.lengths, valid, new_len)
        self.lengths = self.lengths + n_keep
        self.lengths_cpu = [a + b for a, b in zip(self.lengths_cpu, n_cpu)]
        self.pending = None
        return self.drafter.logits(out).float().log_softmax(-1)

    # -- drafting ---------------------------------------------------------------------------
    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        """One group pass, then this step's tree: the static one, or DDTree."""
        top = self.group_log_q().topk(self.topk, dim=-1)
        ids = self.drafter.draft_to_target(top.indices)
        B = root.shape[0]
        if self.tree is not None:
            parents, depths, ranks, anc = self.tree
            tokens, log_scores = block_tree.fill_static(root, top.values, ids, depths, ranks, anc)
            parents, depths = parents.expand(B, -1), depths.expand(B, -1)
        else:
            tokens, parents, depths, log_scores = block_tree.best_first(
                root, top.values, ids, self.n, self.drafts
            )
        return Tree(tokens, parents, depths, log_scores.exp(), torch.ones_like(tokens, dtype=torch.bool))

    def select_rows(self, rows: torch.Tensor) -> None:
        kv.select_rows(self.cache, rows)
        self.select_pending(rows)
