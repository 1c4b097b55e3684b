"""What one ``generate``/``stream`` call of the decoder counted and timed.

A call's wall time is split into parts with one clock: every boundary between two parts reads
the clock once and charges the interval since the last boundary to the part that just ended, so
the parts add up to the call's total exactly and no second is left unaccounted:

* ``setup``: the call's settings, sampling uniforms, the planner;
* ``prefill``: the prompts read into the cache, the first token;
* ``draft``: the proposer's tree (drafter passes, lookup branches);
* ``planner``: reading the tree's scores, choosing and pruning the nodes to verify;
* ``verify``: the target's forward over the tree and the acceptance rule;
* ``bookkeeping``: the cache kept to the accepted path, the proposer told, stop checks, rows
  leaving the batch, the call's backend switched on and off;
* ``caller``: time the caller spent between two yields of ``stream`` (printing, say).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PARTS = ("setup", "prefill", "draft", "planner", "verify", "bookkeeping", "caller")


@dataclass
class DecodeStats:
    """Counters of one ``generate``/``stream`` call (all rows together)."""

    target_forwards: int = 0  # prefill included
    new_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)  # per row and step: drafts + bonus
    accepted_depths: list[int] = field(default_factory=list)  # per row and step: drafts accepted
    tree_tokens: list[int] = field(default_factory=list)  # per step: nodes verified per row (root incl.)
    undrafted_steps: int = 0  # steps the planner ran without the drafter (drafting did not pay)
    setup_time_s: float = 0.0
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    planner_time_s: float = 0.0
    verify_time_s: float = 0.0
    bookkeeping_time_s: float = 0.0
    caller_time_s: float = 0.0
    total_time_s: float = 0.0
    backend: str = "eager"
    last_mark: float | None = field(default=None, repr=False)  # the clock at the last boundary

    def lap(self, part: str, now: float) -> float:
        """Charge the time since the last boundary to ``part`` (one of :data:`PARTS`); returns it.
        The first call only starts the clock."""
        elapsed = 0.0 if self.last_mark is None else now - self.last_mark
        self.last_mark = now
        setattr(self, f"{part}_time_s", getattr(self, f"{part}_time_s") + elapsed)
        self.total_time_s += elapsed
        return elapsed

    def split(self) -> dict[str, float]:
        """Seconds per part (:data:`PARTS`); they add up to ``total_time_s``."""
        return {p: getattr(self, f"{p}_time_s") for p in PARTS}

    def split_line(self) -> str:
        """``prefill 0.31s, draft 0.12s, ...``: the parts a report prints."""
        return ", ".join(f"{p} {s:.2f}s" for p, s in self.split().items())

    @property
    def steps(self) -> int:
        return max(self.target_forwards - 1, 0)

    @property
    def tau(self) -> float:
        """Mean tokens per decoding step (target forward), bonus token included."""
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def per_position_acceptance(self) -> list[float]:
        """Fraction of steps whose draft at depth d (1-based, index d-1) was accepted."""
        steps = max(len(self.accepted_depths), 1)
        top = max(self.accepted_depths, default=0)
        return [sum(a >= d for a in self.accepted_depths) / steps for d in range(1, top + 1)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0
