"""What one ``generate``/``stream`` call of the decoder counted and timed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """Counters of one ``generate``/``stream`` call (all rows together)."""

    target_forwards: int = 0  # prefill included
    new_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)  # per row and step: drafts + bonus
    accepted_depths: list[int] = field(default_factory=list)  # per row and step: drafts accepted
    tree_tokens: list[int] = field(default_factory=list)  # per step: nodes verified per row (root incl.)
    undrafted_steps: int = 0  # steps the planner ran without the drafter (drafting did not pay)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    total_time_s: float = 0.0
    backend: str = "eager"

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
