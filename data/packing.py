"""Mixing components to their weights, and packing whole rows into fixed-length sequences."""

from __future__ import annotations

import random


def mix(parts: list, seed: int):
    """Resample components to their weights' shares of the total row count, then shuffle.

    The total is the number of kept rows over all components. A component asked for more rows
    than it has is repeated (its ``mixed_rows`` exceeds ``kept``); the report shows both.
    """
    import datasets

    total = sum(len(ds) for ds, _ in parts)
    wsum = sum(r.weight for _, r in parts)
    rng = random.Random(seed)
    picked, offset = [], 0
    for ds, report in parts:
        n = round(total * report.weight / wsum) if len(ds) else 0
        order = list(range(len(ds)))
        if order:
            rng.shuffle(order)
        picked += [offset + order[i % len(ds)] for i in range(n)]
        report.mixed_rows = n
        offset += len(ds)
    rng.shuffle(picked)
    return datasets.concatenate_datasets([ds for ds, _ in parts]).select(picked)


def pack(rows: list[dict], max_length: int) -> list[dict]:
    """Concatenate whole rows, in order, into sequences of at most ``max_length`` tokens."""
    packed: list[dict] = []
    cur: dict | None = None
    for r in rows:
        n = len(r["input_ids"])
        if cur is None or len(cur["input_ids"]) + n > max_length:
            cur = {"input_ids": [], "loss_mask": [], "position_ids": [], "sources": []}
            packed.append(cur)
        mask = list(r["loss_mask"])
        if cur["input_ids"]:
            mask[0] = 0  # never predict a document's first token from the previous document
        cur["input_ids"] += r["input_ids"]
        cur["loss_mask"] += mask
        cur["position_ids"] += list(range(n))
        cur["sources"].append(r["source"])
    for p in packed:
        p["source"] = "+".join(sorted(set(p.pop("sources"))))
    return [p for p in packed if sum(p["loss_mask"])]


def pack_batch(batch: dict, max_length: int) -> dict:
    """``datasets.map`` function over the whole dataset: :func:`pack` in columns."""
    rows = [
        {"input_ids": i, "loss_mask": m, "source": s}
        for i, m, s in zip(batch["input_ids"], batch["loss_mask"], batch["source"])
    ]
    packed = pack(rows, max_length)
    return {c: [p[c] for p in packed] for c in ("input_ids", "loss_mask", "position_ids", "source")}
