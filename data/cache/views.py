"""Feature caches made of other caches' shards: mixtures and slices, nothing copied.

A view is a cache folder holding only a ``manifest.json`` whose shards are named by their path
relative to the view, so training reads it as any other cache
(:class:`~draftheads.data.cache.read.FeatureCache`). :func:`combine_caches` mixes whole caches, a
small source weighted up by repeating it; :func:`write_view` is the writer beneath it, for any
listed shards (the bench's scaling points read the first shards of a cache this way).
"""

from __future__ import annotations

import os
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.data.cache.manifest import MANIFEST, read_manifest, write_json
from draftheads.heads.target.fingerprint import TargetFingerprint

# what every cache of a combined view must agree on, beyond the target
VIEW_KEYS = ("layers", "feature_dim", "dtype", "topk", "target_next")


def combine_caches(sources: list[tuple[Path, int]], out: Path) -> dict:
    """Write ``out/manifest.json``: a cache that reads each ``(cache, repeats)`` source's shards
    ``repeats`` times, in order, without copying them (shards are named by relative path).

    This is how separately built caches (teacher-forced text, self-distilled answers) train as one
    mixture, with a smaller source weighted up by repeating it; the sources must share the
    target, layers, dtype and label columns. Returns the manifest.
    """
    out = Path(out)
    read = [(Path(d), read_manifest(Path(d)), r) for d, r in sources]
    if not read:
        raise UserError("combine_caches: no source caches given; name at least one feature cache")
    first_dir, first, _ = read[0]
    expected = TargetFingerprint.from_dict(first["fingerprint"])
    for d, m, repeats in read:
        if not m.get("complete"):
            raise UserError(f"feature cache {d} is incomplete; rerun `draftheads features` to finish it")
        if repeats < 1:
            raise UserError(f"feature cache {d}: repeats must be at least 1, got {repeats}")
        bad = TargetFingerprint.from_dict(m["fingerprint"]).mismatches(expected)
        bad += [k for k in VIEW_KEYS if m.get(k) != first.get(k)]
        if bad:
            raise UserError(
                f"feature caches {first_dir} and {d} differ in {', '.join(bad)} and cannot train together; "
                f"rebuild {d} with `draftheads features` for the same target, layers and top-k"
            )
    parts = [(d, m["shards"]) for d, m, repeats in read for _ in range(repeats)]
    return write_view(
        out,
        first,
        parts,
        num_tokens=sum(m.get("num_tokens", 0) * r for _, m, r in read),
        num_loss_tokens=sum(m["num_loss_tokens"] * r for _, m, r in read),
    )


def write_view(out: Path, base: dict, parts: list[tuple[Path, list[dict]]], **totals: int) -> dict:
    """Write ``out/manifest.json``: a cache made of the listed shards of other caches, read in
    the order given with their rows renumbered from 0, nothing copied (each shard is named by its
    path relative to ``out``). ``base`` is a source's manifest (target, layers, dtype, label
    columns); ``totals`` are the view's own counts (``num_loss_tokens``, and ``num_tokens`` where
    known). Returns the manifest."""
    out = Path(out)
    shards, rows = [], 0
    for d, entries in parts:
        start = entries[0]["rows"][0] if entries else 0
        for s in entries:
            a, z = s["rows"]
            name = os.path.relpath(Path(d) / s["file"], out)
            shards.append({"file": name, "rows": [rows + a - start, rows + z - start]})
        rows += entries[-1]["rows"][1] - start if entries else 0
    counts = ("shards", "view_of", "num_rows", "num_tokens", "num_loss_tokens")
    manifest = {
        **{k: v for k, v in base.items() if k not in counts},
        "shards": shards,
        "num_rows": rows,
        **totals,
        "view_of": [str(d) for d, _ in parts],
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MANIFEST, manifest)
    return manifest
