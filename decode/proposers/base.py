"""The proposer protocol: what a drafting method implements to plug into the decoder.

A proposer drafts one token tree per step for every active row of a batch. The decoder calls,
in order::

    prefill(Prefill)            # once, after the target has read the prompts
    repeat:
        propose(root, pos, plan) -> Tree     # draft this step's tree
        update(Accepted)                     # what the target accepted, and its hidden states
        select_rows(rows)                    # (when rows finish) keep only these rows

A new drafting method is one new module with one class that implements these four methods.
Node scores are the proposer's estimate of the probability that the target accepts the node
(its whole path); the decoder uses them to verify only the nodes that pay for themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from draftheads.conf.schema.kinds import kind_record
from draftheads.decode.tree import Tree


@dataclass
class Prefill:
    """What the target's prompt forward gives a proposer.

    ``hidden_states``: the target's ``hidden_states`` tuple ``[B, P, H]`` per entry, holding the
    proposer's ``hidden_layers`` and None at every other index (None when it asks for none);
    ``input_ids``/``valid``/``positions`` ``[B, P]`` (left padding is not valid);
    ``root [B]``: the first new token, the root of the first tree.
    """

    hidden_states: Sequence[torch.Tensor] | None
    input_ids: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    root: torch.Tensor


@dataclass
class Accepted:
    """What one verification step accepted, per active row.

    ``path [B, A]``: tree node indices from the root down the accepted path (padded after
    ``n_keep``); ``tokens [B, A]``: the tokens that follow them (accepted drafts, then the
    bonus); ``n_keep [B]`` (and ``n_cpu``, the same on the host): tokens emitted = path nodes
    kept; ``pos [B]``: the root's position; ``hidden_states``: the target's states at the tree
    nodes, as in :class:`Prefill`; ``tokens_cpu``: each row's emitted tokens on
    the host (the decoder has read them already, so a proposer need not read the device again).
    """

    hidden_states: Sequence[torch.Tensor] | None
    path: torch.Tensor
    tokens: torch.Tensor
    n_keep: torch.Tensor
    n_cpu: list[int]
    pos: torch.Tensor
    tokens_cpu: list[list[int]] | None = None


@dataclass
class Expanded:
    """What a level-by-level (dynamic tree) expansion drafted, for the planner to judge after the step.

    ``scores [B, C]``: every candidate's path probability, level by level; ``counts[d - 1]``:
    how many of them levels 1..d hold; ``frontiers [B, D, k]``: after each of the ``D`` levels
    drafted, the path probabilities of the ``k`` nodes the next pass expands (or would have);
    ``cap``: the most levels the proposer drafts (``decode.depth``). Device tensors: the decoder
    reads them in the same transfer as the tree's scores.
    """

    scores: torch.Tensor
    frontiers: torch.Tensor
    counts: list[int]
    cap: int


@dataclass
class Plan:
    """The decoder's drafting plan for one step, decided before it (nothing is read mid-draft).

    ``depth``: how many levels a level-by-level expansion drafts (None: its cap). Such a proposer
    leaves what it drafted in ``expanded``, from which the planner sets the next step's depth.
    ``trust``: the factor the planner will scale the drafter's scores by; scores measured
    otherwise (lookup's) are divided by it, so that they reach the planner as they are.
    """

    depth: int | None = None
    trust: float = 1.0
    expanded: Expanded | None = None


@runtime_checkable
class Proposer(Protocol):
    """A drafting method. ``hidden_layers``: the indices of the target's ``hidden_states`` tuple
    that prefill/update read (index i is the input of layer i, index num_layers the final normed
    state); the target keeps only those. Empty: none."""

    hidden_layers: tuple[int, ...]

    def prefill(self, batch: Prefill) -> None: ...

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan: Plan | None = None) -> Tree: ...

    def update(self, step: Accepted) -> None: ...

    def select_rows(self, rows: torch.Tensor) -> None: ...


def single_node(root: torch.Tensor) -> Tree:
    """The tree of just the root: one plain decoding step."""
    ones = torch.ones_like(root, dtype=torch.float32)[:, None]
    zero = torch.zeros_like(root)[:, None]
    return Tree(root[:, None], zero, zero, ones, torch.ones_like(zero, dtype=torch.bool))


def proposer_class(kind: str) -> Any:
    """The proposer class its record names for drafter ``kind``; one clear error naming the known kinds."""
    return kind_record(kind).proposer_class()
