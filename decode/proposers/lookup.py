"""Lookup branches: draft the continuation of the latest earlier match of the text's suffix.

As in prompt lookup decoding: the last g tokens (g = ``ngram`` down to 1) are searched for in
the prompt and the text generated so far; the tokens that followed the most recent earlier
occurrence are the draft. An index from each n-gram to where its latest continuation starts
is updated as tokens arrive, so a lookup is a few dictionary reads.

Scores come from experience: for each match length g and draft depth j, the rate at which a
lookup token at depth j was the target's token, given the ones before it were. The path score
of depth j is the product of those rates (starting from a prior). A prompt with no match
proposes nothing.
"""

from __future__ import annotations

import torch

from draftheads.decode.proposers.base import Accepted, Plan, Prefill, Tree
from draftheads.decode.select import from_rows

PRIOR_RATE = 0.5  # assumed per-token acceptance before anything was observed
PRIOR_WEIGHT = 4.0  # how many observations the prior is worth


class NgramIndex:
    """One row's token history and, per n-gram, where its latest continuation starts."""

    def __init__(self, tokens: list[int], ngram: int) -> None:
        self.ngram, self.tokens, self.index = ngram, [], {}
        self.extend(tokens)

    def extend(self, new: list[int]) -> None:
        for t in new:
            n = len(self.tokens)  # t lands at n: every n-gram ending at n - 1 now has a continuation
            for g in range(1, min(self.ngram, n) + 1):
                self.index[tuple(self.tokens[n - g : n])] = n
            self.tokens.append(t)

    def lookup(self, length: int) -> tuple[list[int], int]:
        """The draft (up to ``length`` tokens) and the match length g that found it (0: none)."""
        for g in range(min(self.ngram, len(self.tokens)), 0, -1):
            start = self.index.get(tuple(self.tokens[-g:]))
            if start is not None:
                return self.tokens[start : start + length], g
        return [], 0


class LookupProposer:
    """Drafts from n-gram matches in each row's own text; no model involved."""

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, max_tokens: int, ngram: int) -> None:
        self.max_tokens, self.ngram = max_tokens, ngram
        self.rows: list[NgramIndex] = []
        self.last: list[tuple[list[int], int]] = []
        # accepted / tried counts per (match length g, depth j)
        self.tried = torch.zeros(ngram + 1, max_tokens + 1)
        self.hits = torch.zeros(ngram + 1, max_tokens + 1)

    def prefill(self, batch: Prefill) -> None:
        ids, valid, root = batch.input_ids.tolist(), batch.valid.tolist(), batch.root.tolist()
        self.rows = [
            NgramIndex([t for t, v in zip(r, m) if v] + [x], self.ngram) for r, m, x in zip(ids, valid, root)
        ]

    def level(self) -> int:
        """The longest n-gram match any row's lookup finds now (0: none), read on the host: how
        much the text is being copied, which decides whether a step drafts (the planner's duel)."""
        return max((row.lookup(1)[1] for row in self.rows), default=0)

    def chains(self) -> list[tuple[list[int], list[float]]]:
        """Each row's lookup draft and its path scores; remembered to learn from the outcome."""
        self.last = [row.lookup(self.max_tokens) for row in self.rows]
        rates = (self.hits + PRIOR_RATE * PRIOR_WEIGHT) / (self.tried + PRIOR_WEIGHT)
        out = []
        for chain, g in self.last:
            out.append((chain, rates[g, 1 : len(chain) + 1].cumprod(0).tolist() if chain else []))
        return out

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree:
        rows = []
        for row, (chain, scores) in zip(self.rows, self.chains()):
            r, n = row.tokens[-1], len(chain)  # the root: the last token emitted, known on the host
            rows.append(([r] + chain, [0] + list(range(n)), list(range(n + 1)), [1.0] + scores))
        return from_rows(rows, root.device)

    def update(self, step: Accepted) -> None:
        emitted = step.tokens_cpu if step.tokens_cpu is not None else step.tokens.tolist()
        for i, (row, n) in enumerate(zip(self.rows, step.n_cpu)):
            new = emitted[i][:n]
            if i < len(self.last):
                self._learn(*self.last[i], new)
            row.extend(new)

    def _learn(self, chain: list[int], g: int, truth: list[int]) -> None:
        """Count, per depth, whether the lookup token equalled what the target emitted there
        (only depths the target decided, i.e. up to the first miss and at most len(truth))."""
        for j, (c, t) in enumerate(zip(chain, truth), start=1):
            self.tried[g, j] += 1
            if c != t:
                break
            self.hits[g, j] += 1

    def select_rows(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.rows = [self.rows[i] for i in keep]
        self.last = [self.last[i] for i in keep if i < len(self.last)]
