"""Drafting whose outcome is known in advance: an oracle that is right at a set rate, and none.

The oracle drafts each row's reference continuation with right tokens at a set per-token rate,
so the decoder's tau is known before it runs (:func:`expected_tau`) and a mismatch is the
decoder's fault. :class:`OneToken` drafts nothing, so the decoder's loop becomes plain greedy
decoding on its own path: the baseline its speculative runs are timed against.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from draftheads.decode.proposers.base import Accepted, Plan, Prefill, Tree

DEPTH = 6  # the oracle's chain: 1 + 2 * DEPTH = 13 nodes, bucket 16


def expected_tau(rate: float, depth: int) -> float:
    return sum(rate**j for j in range(depth + 1))


class Oracle:
    """Drafts each row's reference continuation: a chain of ``depth`` tokens and a wrong sibling at
    every depth. The number of right drafts per row-step follows a low-discrepancy sequence of
    the truncated geometric law P(k >= j) = rate^j, so tau = sum_{j=0..depth} rate^j.

    Positions are tracked on the host from what each step kept, so drafting reads nothing from
    the device. ``kept`` collects the tokens the decoder emitted per row-step (tau as verified),
    over the steps that had room for the whole chain before ``new`` tokens.
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, refs: list[list[int]], rate: float, depth: int, vocab: int, new: int) -> None:
        self.refs, self.rate, self.depth, self.vocab, self.new = refs, rate, depth, vocab, new
        self.u, self.kept, self.planned, self.full = 0.0, [], [], []

    def prefill(self, batch: Prefill) -> None:
        self.rows = list(range(batch.input_ids.shape[0]))
        self.done = [1] * len(self.rows)  # tokens emitted so far per row (the root is ref[0])

    def right_drafts(self) -> int:
        self.u = (self.u + 0.6180339887498949) % 1.0
        k = 0
        while k < self.depth and self.u < self.rate ** (k + 1):
            k += 1
        return k

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        from draftheads.decode.proposers.base import Tree

        D, V = self.depth, self.vocab
        tokens = []
        # a step counts towards tau when the row has room for the whole chain and its bonus
        # (nearer the end the decoder caps the tree's depth at the tokens left)
        self.full = [g + D + 1 <= self.new for g in self.done]
        for b, g, full in zip(self.rows, self.done, self.full):
            ref, k = self.refs[b], self.right_drafts()
            self.planned += [1 + k] * full
            truth = [ref[g + j] if g + j < len(ref) else 0 for j in range(D)]
            chain = [t if j < k else (t + V // 2) % V for j, t in enumerate(truth)]
            tokens.append([0] + chain + [(t + V // 3) % V for t in truth])
        parents = [0] + list(range(D)) + [0] + list(range(1, D))
        depths = [0] + list(range(1, D + 1)) * 2
        B, T, dev = len(tokens), 1 + 2 * D, root.device
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=dev)  # noqa: E731
        tok = as_long(tokens)
        tok[:, 0] = root
        return Tree(
            tok,
            as_long(parents).expand(B, T),
            as_long(depths).expand(B, T),
            torch.ones(B, T, device=dev),
            torch.ones(B, T, dtype=torch.bool, device=dev),
        )

    def update(self, step: Accepted) -> None:
        self.kept += [n for n, full in zip(step.n_cpu, self.full) if full]
        self.done = [g + n for g, n in zip(self.done, step.n_cpu)]

    def select_rows(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.rows, self.done = [self.rows[i] for i in keep], [self.done[i] for i in keep]

    def tau(self) -> float:
        return statistics.mean(self.kept) if self.kept else float("nan")


class OneToken:
    """No drafts: every step verifies the root alone (plain greedy decoding on the decoder's path)."""

    hidden_layers: tuple[int, ...] = ()

    def prefill(self, batch: Prefill) -> None:
        pass

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        from draftheads.decode.proposers.base import single_node

        return single_node(root)

    def update(self, step: Accepted) -> None:
        pass

    def select_rows(self, rows: torch.Tensor) -> None:
        pass
