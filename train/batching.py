"""Rows -> padded micro-batches, in an order that is a pure function of (seed, step).

Every sample a run will ever see is indexed by a global counter
``i = ((step * grad_accum + micro) * world + rank) * micro_batch + j``; epoch ``i // n`` is a
fresh permutation of the rows seeded by ``seed + epoch``. So ranks read disjoint rows, and a
resumed run reads exactly the rows the uninterrupted run would have read, with no sampler
state to save.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftheads.conf.errors import UserError


@dataclass(frozen=True)
class Layout:
    """Where one rank's micro-batches sit in the global sample stream."""

    micro_batch: int
    grad_accum: int
    world: int
    rank: int

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.world


def split_heldout(n: int, eval_rows: int, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): a fixed random ``eval_rows`` rows are held out."""
    if n < 2:
        raise UserError(f"the training data has {n} row(s); need at least 2 (one is held out for evaluation)")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    held = min(eval_rows, max(1, n // 10))
    return sorted(perm[held:]), sorted(perm[:held])


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000003 + epoch)).tolist()


class StepSampler:
    """Indices (into the training rows) of one rank's micro-batch ``micro`` of optimizer step ``step``."""

    def __init__(self, n: int, seed: int, layout: Layout) -> None:
        self.n, self.seed, self.layout = n, seed, layout
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            self._orders = {epoch: epoch_order(self.n, self.seed, epoch)}
        return self._orders[epoch]

    def indices(self, step: int, micro: int) -> list[int]:
        lay = self.layout
        start = ((step * lay.grad_accum + micro) * lay.world + lay.rank) * lay.micro_batch
        return [self._order(i // self.n)[i % self.n] for i in range(start, start + lay.micro_batch)]


def right_pad(seqs: Sequence[torch.Tensor], length: int, fill: int | float = 0) -> torch.Tensor:
    """Stack ``[n_b, ...]`` tensors into ``[B, length, ...]``, each row padded at the end with ``fill``."""
    out = seqs[0].new_full((len(seqs), length, *seqs[0].shape[1:]), fill)
    for b, x in enumerate(seqs):
        out[b, : x.shape[0]] = x
    return out


def collate(rows: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows to the longest one: input_ids, attention_mask, loss_mask (and the cached
    features and top-k logits when the rows carry them, position_ids, padded with 0, when they
    are packed)."""
    T = max(len(r["input_ids"]) for r in rows)

    def column(key: str, fill: int = 0) -> torch.Tensor:
        return right_pad([torch.as_tensor(r[key], dtype=torch.long) for r in rows], T, fill)

    out = {"input_ids": column("input_ids", pad_id), "loss_mask": column("loss_mask")}
    out["attention_mask"] = right_pad([torch.ones(len(r["input_ids"]), dtype=torch.long) for r in rows], T)
    if "position_ids" in rows[0]:
        out["position_ids"] = column("position_ids")
    for key in ("features", "topk_logits"):
        if key in rows[0]:
            out[key] = right_pad([torch.as_tensor(r[key]) for r in rows], T)
    if "topk_ids" in rows[0]:
        out["topk_ids"] = column("topk_ids")
    return out


def collate_packed(rows: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Every row end to end in one row ``[1, sum of lengths]``: no padding to compute on.

    Each row keeps its own ``position_ids`` (counted from 0, or its own when it is already a
    packed row), which is all that keeps attention and labels inside it (see
    ``heads.masks.packed_causal`` and ``train.objectives.label_mask``), so every loss is the
    padded batch's loss (the same counted positions, the same mean).
    """

    def column(key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.cat([torch.as_tensor(r[key], dtype=dtype) for r in rows])[None]

    lengths = [len(r["input_ids"]) for r in rows]
    out = {"input_ids": column("input_ids", torch.long), "loss_mask": column("loss_mask", torch.long)}
    out["attention_mask"] = torch.ones(1, sum(lengths), dtype=torch.long)
    if "position_ids" in rows[0]:
        out["position_ids"] = column("position_ids", torch.long)
    else:
        out["position_ids"] = torch.cat([torch.arange(n) for n in lengths])[None]
    for key in ("features", "topk_logits"):
        if key in rows[0]:
            out[key] = column(key)
    if "topk_ids" in rows[0]:
        out["topk_ids"] = column("topk_ids", torch.long)
    return out


def micro_batch(rows: Sequence[dict], pad_id: int, pack: bool) -> dict[str, torch.Tensor]:
    """A micro-batch of ``rows``: packed end to end (:func:`collate_packed`) when ``pack`` is set
    and the rows carry cached features (nothing runs the target on them), else padded."""
    return collate_packed(rows) if pack and "features" in rows[0] else collate(rows, pad_id)


class RowView(Sequence):
    """Rows ``source[indices[i]]``, read when indexed: a memory-mapped feature cache stays on disk."""

    def __init__(self, source: Sequence, indices: Sequence[int]) -> None:
        self.source, self.indices = source, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.source[j] for j in self.indices[i]]
        return self.source[self.indices[i]]


def check_rows(rows: Sequence[dict]) -> None:
    """Rows must carry equally long input_ids and loss_mask; say which row does not."""
    for i, r in enumerate(rows):
        if "input_ids" not in r or "loss_mask" not in r:
            raise UserError(
                f"training row {i} has no input_ids/loss_mask columns; prepare the data with draftheads data"
            )
        if len(r["input_ids"]) != len(r["loss_mask"]) or len(r["input_ids"]) < 2:
            raise UserError(
                f"training row {i}: input_ids ({len(r['input_ids'])}) and loss_mask ({len(r['loss_mask'])}) "
                "must have the same length >= 2"
            )
