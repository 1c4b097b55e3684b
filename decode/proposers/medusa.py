"""Medusa: head k's top candidates at the last accepted position fill depth k+1 of a static tree.

Only the heads the tree reaches are evaluated, on one position per row, and only the
candidates the tree uses (top max-rank+1 per head) are kept. A node's score is the product of
its heads' probabilities along its path: the heads are independent given the hidden state,
so that is their estimate that the whole path is right.
"""

from __future__ import annotations

import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.proposers.base import Accepted, Plan, Prefill, Tree
from draftheads.decode.tree import StaticTree, ancestor_mask, levels


class MedusaProposer:
    @classmethod
    def for_drafter(cls, drafter, static: StaticTree | None, cfg: DecodeConfig) -> MedusaProposer:
        """The proposer for ``drafter`` (what :func:`~draftheads.decode.proposers.build_proposer` calls)."""
        return cls(drafter, static)

    def __init__(self, drafter, static: StaticTree) -> None:
        self.drafter, self.static = drafter, static
        self.layer = drafter.feature_layers()[0]
        self.hidden_layers = (self.layer,)
        self.topk = static.topk_per_depth()
        self.levels = levels(static, ancestor_mask(static.parents, static.depth))
        self.hidden: torch.Tensor | None = None

    def prefill(self, batch: Prefill) -> None:
        self.hidden = batch.hidden_states[self.layer][:, -1]

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        depth = len(self.topk)
        logits = self.drafter.heads_logits(self.drafter.head_hidden(self.hidden, depth))  # [D, B, V]
        B, T = root.shape[0], self.static.size
        tokens = torch.zeros(B, T, dtype=torch.long, device=root.device)
        scores = torch.ones(B, T, dtype=torch.float32, device=root.device)
        parents = self.static.parents.expand(B, -1)
        for d, (k, (nodes, _, _, ranks, _, _)) in enumerate(zip(self.topk, self.levels)):
            top = logits[d].float().softmax(-1).topk(k, dim=-1)
            tokens[:, nodes] = top.indices[:, ranks]
            scores[:, nodes] = scores.gather(1, parents[:, nodes]) * top.values[:, ranks]
        tokens[:, 0] = root
        return Tree(
            tokens,
            parents,
            self.static.depths.expand(B, -1),
            scores,
            torch.ones(B, T, dtype=torch.bool, device=root.device),
        )

    def update(self, step: Accepted) -> None:
        rows = torch.arange(step.path.shape[0], device=step.path.device)
        last = step.path.gather(1, (step.n_keep - 1)[:, None])[:, 0]
        self.hidden = step.hidden_states[self.layer][rows, last]

    def select_rows(self, rows: torch.Tensor) -> None:
        self.hidden = self.hidden.index_select(0, rows)
