"""Draft vocabularies (a drafter's reduced one, from the tokens it will be asked to predict) and
the count behind the check that a drafter's mask token never occurs in the data."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch


def masked_token_counts(rows: Iterable[dict], vocab_size: int) -> torch.Tensor:
    """How often each token id appears at a loss-masked position (an assistant token) in ``rows``."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in rows:
        ids = torch.as_tensor(r["input_ids"], dtype=torch.long)
        mask = torch.as_tensor(r["loss_mask"]).bool()
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocab(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids, sorted; ties (and never-seen ids) go to the lower id.

    Deterministic, so every rank of a data-parallel run builds the same vocabulary.
    """
    # A stable sort on -count keeps equal counts in id order.
    order = torch.sort(-counts, stable=True).indices
    return order[:size].sort().values


def vocab_coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Fraction of the counted (assistant) tokens whose id is in the draft vocabulary."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0


def token_occurrences(rows: Iterable[dict], token_id: int) -> tuple[int, int | None]:
    """(how often ``token_id`` occurs anywhere in the rows' ``input_ids``, the first row holding it)."""
    total, first = 0, None
    for i, r in enumerate(rows):
        n = int((torch.as_tensor(r["input_ids"]) == token_id).sum())
        if n and first is None:
            first = i
        total += n
    return total, first


def set_draft_vocab(drafter: Any, tokens: Sequence[dict]) -> float:
    """The ``draft_vocab_size`` most frequent answer tokens of the training rows as ``drafter``'s
    draft vocabulary; returns their share of the answer tokens (rounded to 4 places)."""
    counts = masked_token_counts(tokens, drafter.target_fingerprint.vocab_size)
    ids = draft_vocab(counts, drafter.draft_vocab_size)
    drafter.set_vocab(ids)
    return round(vocab_coverage(counts, ids), 4)
