"""A drafter's tree with a lookup branch: both verified in the same target forward.

The lookup chain is added below the root of each row's drafted tree; where it agrees with a
drafted path it reuses those nodes (and raises their score), so nothing is verified twice. The
merge runs on the device (:func:`draftheads.decode.select.add_chains`): the tree grows by the
longest chain's length, the chain tokens a drafted path already holds left as padding for the
planner's prune to drop, and the decoder reads the merged tree's scores in its one transfer.
Lookup scores are measured acceptance rates; the planner scales the drafter's scores by its
``trust``, so the chains' scores enter divided by it (:class:`~draftheads.decode.proposers.base.Plan`).
"""

from __future__ import annotations

import torch

from draftheads.decode.proposers.base import Accepted, Plan, Prefill, Proposer, Tree
from draftheads.decode.proposers.lookup import LookupProposer
from draftheads.decode.select import add_chains


class WithLookup:
    """``proposer``'s trees plus ``lookup``'s chains."""

    def __init__(self, proposer: Proposer, lookup: LookupProposer) -> None:
        self.proposer, self.lookup = proposer, lookup
        self.hidden_layers = proposer.hidden_layers

    @property
    def passes(self) -> int:
        """The drafter's forward passes in the last propose (lookup needs none)."""
        return getattr(self.proposer, "passes", 0)

    def prefill(self, batch: Prefill) -> None:
        self.proposer.prefill(batch)
        self.lookup.prefill(batch)

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        tree = self.proposer.propose(root, pos, plan)
        chains = self.lookup.chains()
        L = max(len(chain) for chain, _ in chains)
        if L == 0:
            return tree
        tokens = torch.tensor([c + [-1] * (L - len(c)) for c, _ in chains], device=root.device)
        trust = plan.trust if plan is not None else 1.0  # lookup's rates are measured: undo the drafter's
        scores = torch.tensor(
            [[x / trust for x in s] + [0.0] * (L - len(s)) for _, s in chains], device=root.device
        )
        return add_chains(tree, tokens, scores)

    def update(self, step: Accepted) -> None:
        self.proposer.update(step)
        self.lookup.update(step)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.proposer.select_rows(rows)
        self.lookup.select_rows(rows)
