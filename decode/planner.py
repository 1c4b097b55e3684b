"""The planner: per step, how many drafted tokens are worth verifying, and whether to draft.

A step with a tree whose node i (root excluded) is accepted with probability p_i yields, in
expectation, ``E = 1 + Σ p_i`` tokens per row (the bonus token included) and costs
``d + c(B * T)`` seconds (drafting, then verifying T nodes for each of B rows). The planner
keeps, per step, the number of nodes n that maximises expected tokens per second::

    n* = argmax_n  Σ_b (1 + Σ_{i<=n} p_b,(i)) / (d + c(B (n + 1)))

(p_b,(i): row b's i-th best node score; a NaN score counts as 0). n = 0 verifies the root
alone: a plain decoding step.

How deep a level-by-level tree is drafted is decided one step late, so that drafting never waits on a
host read: a further draft pass pays for itself when, even if every frontier node's children
were accepted (their total probability is at most the frontier's), the step's rate would beat
the best rate available without it. Once a step has read its tree's scores (with every
candidate's and each level's frontier in the same transfer), that test is applied to each level
in turn, and the next step drafts up to the first level that did not pay, or one level more
than this step did when all paid (up to ``decode.depth``), so a tree grows back as scores rise.

Whether to draft at all is judged on what steps really gave, not on the scores, as a duel
between a step with the drafter and one without (lookup branches alone, or a plain step), at
each lookup level: the longest n-gram match the lookup branches found this step (0: none, and
always 0 without lookup), since a prompt being copied favours lookup and free text the drafter.
Each side keeps a running mean of its measured rate, ``(B + accepted drafts) / (drafting +
verify forward)``, over a plain step's ``B / c(B)``; the leader runs, and the trailing side is
probed after ``wait`` steps (``wait`` doubles, up to :data:`MAX_WAIT`, while its probes keep
losing, and is back at 1 once it leads). Without lookup branches (level 0) the side without the
drafter is a plain step, whose rate is 1 by definition: it is neither measured nor probed. A drafted step
that keeps no node puts the drafter behind until its next probe, and a probe of the drafter
verifies at least one node, so fresh acceptance reaches the duel and ``trust`` even when the
scores say nothing pays.

Measured time corrects the curve as decoding goes: ``scale`` follows the ratio of the measured
verify forward to the curve's prediction, and the draft pass cost is a running mean. Measured
acceptance corrects the scores: the expected number of accepted drafts of a verified tree is
Σ p_i over its nodes, and ``trust`` follows the ratio of accepted drafts to that sum (a drafter
that is over-confident gets its scores scaled down, an under-confident one up, capped at 1).
``trust`` is the drafter's alone: lookup branches score with their own measured rates, so a
proposer that merges them into a drafted tree divides their scores by ``trust`` (:class:`Plan`
carries it), and a step without the drafter reads its scores as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from draftheads.decode.cost import CostCurve

MAX_WAIT = 32  # the most steps the planner goes without drafting before it probes again


def next_depth(paid: Iterable[bool], depth: int, cap: int) -> int:
    """The levels to draft next step; ``paid`` says, for i = 0, 1, ..., whether level ``i + 2``
    paid for its draft pass given levels ``1..i + 1`` (judged after a step that drafted ``depth``).

    Up to the first level that did not pay; when every level judged paid, one level more than
    ``depth``, at most ``cap``, so the tree grows back when it can.
    """
    missed = next((i for i, p in enumerate(paid) if not p), None)
    return missed + 1 if missed is not None else min(depth + 1, cap)


def _probabilities(scores: torch.Tensor, trust: float) -> torch.Tensor:
    """Node scores as acceptance probabilities: scaled by ``trust``, in [0, 1], NaN as 0."""
    return torch.nan_to_num(scores.float(), nan=0.0).mul(trust).clamp(0.0, 1.0)


class Planner:
    """Per-step choices from the cost curve, corrected by what the steps really cost."""

    def __init__(self, curve: CostCurve, batch: int, lookup: bool = False) -> None:
        self.curve, self.batch = curve, batch
        self.scale = 1.0  # observed / predicted verify time
        self.pass_s = curve(1) * 0.1  # one draft pass, until measured
        self.draft_s = 0.0  # this step's drafting so far
        self.trust = 1.0  # observed / predicted accepted drafts
        self.accepted, self.predicted = 2.0, 2.0  # running sums behind ``trust`` (a mild prior)
        self.lookup = lookup  # whether the proposer has lookup branches (the duel's undrafted side)
        # the duel: per lookup level, each side's running rate over a plain step's (True: drafted)
        self.rates: dict[int, dict[bool, float]] = {}
        self.wait = {True: 1, False: 1}  # per side: steps it sits out while trailing, before a probe
        self.since = {True: 0, False: 0}  # per side: steps since it last ran
        self.level = 0  # this step's lookup level
        self.drafted = True  # whether this step runs the drafter
        self.probe = False  # this step probes the side that trails at its level
        self.chosen: int | None = None  # nodes chosen for this step's tree, when it was drafted
        self.depth: int | None = None  # levels a level-by-level tree drafts next (None: its cap)
        self.step_s = 0.0  # this step's drafting and verify forward, measured

    def carry(self, last: Planner) -> None:
        """Start from what the same decoder's last call at this call's acceptance setting learned
        (the decoder keeps one per setting: greedy, or sampling at its temperature and warpers), as
        priors that this call's steps soon outweigh: the curve's scale, a draft pass's cost,
        ``trust`` (kept as about four steps' evidence), every lookup level's duel and the
        level-by-level depth. The probes' waits start over."""
        self.scale, self.pass_s, self.depth = last.scale, last.pass_s, last.depth
        weight = min(1.0, 4.0 / max(last.predicted, 1e-6))
        self.predicted, self.accepted, self.trust = (
            last.predicted * weight,
            last.accepted * weight,
            last.trust,
        )
        self.rates = {level: dict(rates) for level, rates in last.rates.items()}

    def verify_s(self, tokens: int) -> float:
        return self.scale * self.curve(tokens)

    def best(
        self,
        scores: torch.Tensor,
        valid: torch.Tensor | None = None,
        draft_s: float | None = None,
        trust: float | None = None,
    ) -> tuple[int, float, float]:
        """``(n, expected tokens, seconds)`` of the best number of nodes per row (root excluded)
        for node scores ``[B, N]`` (root excluded), with ``draft_s`` of drafting (default: this
        step's) and scores scaled by ``trust`` (default: the drafter's)."""
        draft_s = self.draft_s if draft_s is None else draft_s
        s = _probabilities(scores, self.trust if trust is None else trust)
        s = s if valid is None else torch.where(valid, s, 0.0)
        B, N = s.shape
        gain = s.sort(dim=-1, descending=True).values.cumsum(-1).sum(0).tolist()  # Σ_b Σ_{i<=n}
        best = (0, float(B), draft_s + self.verify_s(B))
        for n in range(1, N + 1):
            e, t = B + gain[n - 1], draft_s + self.verify_s(B * (n + 1))
            if e / t > best[1] / best[2]:
                best = (n, e, t)
        return best

    def duel(self, level: int) -> dict[bool, float]:
        """Each side's rate at lookup ``level``; a level seen for the first time starts from the
        last step's (what the drafter just did is the best guess there too)."""
        if level not in self.rates:
            self.rates[level] = dict(self.rates.get(self.level, {True: 1.0, False: 1.0}))
        return self.rates[level]

    def leads(self, level: int) -> bool:
        """The side that runs at ``level``: the drafter on a tie (it must be tried to be judged)."""
        rate = self.duel(level)
        return rate[True] >= rate[False]

    def drafting(self, level: int = 0) -> bool:
        """Whether to run the drafter this step, at lookup ``level``: the leading side, or the
        trailing one once it has sat out its ``wait`` (never a plain step: its rate is known)."""
        lead = self.leads(level)
        trailing = not lead
        probeable = trailing or (self.lookup and level > 0)  # a plain step is never probed
        self.probe = probeable and self.since[trailing] >= self.wait[trailing]
        self.level, self.drafted = level, trailing if self.probe else lead
        return self.drafted

    def choose(self, scores: torch.Tensor, valid: torch.Tensor | None = None, drafted: bool = True) -> int:
        """How many nodes per row to verify this step (:meth:`best`); a probe of the drafter
        verifies at least one. ``drafted``: the drafter ran for this tree (else its scores are
        lookup's own, read without ``trust``)."""
        n, _, _ = self.best(scores, valid, trust=None if drafted else 1.0)
        if drafted:
            self.chosen = n
            n = max(n, 1) if self.probe else n
        return n

    def expand(self, scores: torch.Tensor, frontier: torch.Tensor, passes: int) -> bool:
        """Whether one more draft pass over ``frontier [B, k]`` can raise the expected rate, after
        ``passes`` passes drafted the nodes scored ``scores [B, N]``."""
        n, e, t = self.best(scores, draft_s=passes * self.pass_s)
        k = frontier.shape[1]
        optimistic = e + float(_probabilities(frontier, self.trust).sum())
        cost = t + self.pass_s + self.verify_s(self.batch * (n + 1 + k)) - self.verify_s(self.batch * (n + 1))
        return optimistic / cost > e / t

    def replan(self, scores: torch.Tensor, frontiers: torch.Tensor, counts: list[int], cap: int) -> int:
        """Set (and return) the next step's depth from this step's expansion, on the host:
        ``scores [B, C]`` every candidate's path probability, ``counts[d - 1]`` those of levels
        1..d, ``frontiers [B, D, k]`` each level's frontier (``D = len(counts)`` levels drafted).

        Level d + 1 paid when :meth:`expand` says so given levels 1..d (d passes), judged for
        every level drafted after the first and for the one after the last, below ``cap``.
        """
        drafted = len(counts)
        paid = (  # lazily: judging stops at the first level that did not pay
            self.expand(scores[:, : counts[d - 1]], frontiers[:, d - 1], d)
            for d in range(1, min(drafted, cap - 1) + 1)
        )
        self.depth = next_depth(paid, drafted, cap)
        return self.depth

    def calibrate(self, predicted: float, accepted: float) -> None:
        """Fold one step's predicted (Σ p of verified nodes) and accepted drafts in: into ``trust``
        after a drafted step, and the step's measured rate into its side of the duel."""
        chosen, self.chosen = self.chosen, None
        drafted = float(self.drafted)  # evidence ages with every step; only drafted steps add to it
        self.predicted = 0.95 * self.predicted + drafted * predicted
        self.accepted = 0.95 * self.accepted + drafted * accepted
        self.trust = min(max(self.accepted / max(self.predicted, 1e-6), 0.1), 10.0)
        plain = self.batch / self.verify_s(self.batch)
        rate = (self.batch + accepted) / max(self.step_s, 1e-9) / plain
        self.record(self.drafted, rate, chosen is None or chosen > 0)
        self.drafted, self.probe = True, False

    def record(self, drafted: bool, rate: float, kept: bool = True) -> None:
        """Fold a step's measured ``rate`` into its side at this step's level (a plain step's rate
        is 1 by definition: measuring it would only add the clock's noise to the duel). A probe
        that still trails waits twice as long next time, one that leads is back at 1; a drafted
        step that kept no node (``kept`` False) puts the drafter behind at once."""
        rates = self.duel(self.level)
        if drafted or self.level > 0:  # at level 0 the side without the drafter is a plain step: 1
            rates[drafted] = 0.7 * rates[drafted] + 0.3 * rate
        if drafted and not kept:
            rates[True] = min(rates[True], rates[False] - 1e-9)
        if self.probe:
            leads = self.leads(self.level) == drafted
            self.wait[drafted] = 1 if leads else min(2 * self.wait[drafted], MAX_WAIT)
        self.since[drafted], self.since[not drafted] = 0, self.since[not drafted] + 1

    def observe(self, draft_s: float, passes: int, verify_s: float, tokens: int) -> None:
        """Fold one step's measured times in (exponential moving averages): ``verify_s`` is the
        verify forward alone (with the acceptance rule), what the curve measures."""
        if passes > 0:
            self.pass_s = 0.8 * self.pass_s + 0.2 * (draft_s / passes)
        predicted = self.curve(tokens)
        if predicted > 0:
            self.scale = 0.9 * self.scale + 0.1 * min(max(verify_s / predicted, 0.25), 4.0)
        self.step_s, self.draft_s = draft_s + verify_s, 0.0
