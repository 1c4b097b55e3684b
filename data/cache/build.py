"""Build the offline feature cache: run the frozen target once over a prepared dataset.

The builder plans contiguous shards of about ``shard_mb`` MB, prints the expected disk size
before starting, encodes each shard (:func:`~draftheads.data.cache.encode.encode_shard`),
writes it atomically and resumes: a rerun with the same plan skips finished shards, and a
different cache in the same folder is refused. The manifest is written first (incomplete) and
marked complete once every shard is on disk, so a reader never trusts a half-built cache.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.data.cache.encode import encode_shard
from draftheads.data.cache.manifest import CACHE_VERSION, MANIFEST, STORE_DTYPES, read_manifest, write_json
from draftheads.heads.files import atomic_write
from draftheads.heads.target.fingerprint import fingerprint


def bytes_per_token(feature_dim: int, dtype: str, topk: int, target_next: bool) -> int:
    """Disk bytes per token: features, ids (4), mask (1), optional labels (4) and top-k (8 each)."""
    size = torch.tensor([], dtype=STORE_DTYPES[dtype]).element_size()
    return feature_dim * size + 4 + 1 + (4 if target_next else 0) + 8 * topk


def plan_shards(lengths: list[int], token_bytes: int, shard_mb: float) -> list[tuple[int, int]]:
    """Contiguous row ranges ``[a, b)`` of about ``shard_mb`` MB each."""
    limit = max(1, int(shard_mb * 2**20))
    plan, start, acc = [], 0, 0
    for i, n in enumerate(lengths):
        acc += n * token_bytes
        if acc >= limit:
            plan.append((start, i + 1))
            start, acc = i + 1, 0
    if start < len(lengths):
        plan.append((start, len(lengths)))
    return plan


def check_layers(layers: list[int], num_layers: int) -> list[int]:
    """``layers`` as a list, or one line when an id is outside the target's ``[0, num_layers]``."""
    if not layers or any(not 0 <= i <= num_layers for i in layers):
        raise UserError(
            f"data.features.layers={layers}: layer ids must be in [0, {num_layers}] "
            f"({num_layers} is the final normed state)"
        )
    return list(layers)


def build_feature_cache(
    model: nn.Module,
    tokenizer,
    dataset,
    out_dir: str | os.PathLike,
    layers: list[int],
    dtype: str = "bfloat16",
    batch_tokens: int = 4096,
    target_next: bool = False,
    topk: int = 0,
    shard_mb: float = 512.0,
    show_progress: bool = True,
) -> dict:
    """Write the feature cache of ``dataset`` (columns ``input_ids``, ``loss_mask``); returns the manifest."""
    from tqdm.auto import tqdm

    if dtype not in STORE_DTYPES:
        raise UserError(f"data.features.dtype={dtype} is not supported; use one of {', '.join(STORE_DTYPES)}")
    fp = fingerprint(model, tokenizer)
    layers = check_layers(layers, fp.num_layers)
    out = Path(out_dir)
    input_ids, loss_mask = dataset["input_ids"], dataset["loss_mask"]
    lengths = [len(r) for r in input_ids]
    feature_dim = fp.hidden_size * len(layers)
    token_bytes = bytes_per_token(feature_dim, dtype, topk, target_next)
    plan = plan_shards(lengths, token_bytes, shard_mb)
    manifest = {
        "cache_version": CACHE_VERSION,
        "fingerprint": fp.to_dict(),
        "layers": layers,
        "dtype": dtype,
        "feature_dim": feature_dim,
        "target_next": target_next,
        "topk": topk,
        "num_rows": len(lengths),
        "num_tokens": sum(lengths),
        "num_loss_tokens": int(sum(sum(m) for m in loss_mask)),
        "shards": [{"file": f"shard-{k:05d}.safetensors", "rows": [a, b]} for k, (a, b) in enumerate(plan)],
        "complete": False,
    }
    total = sum(lengths) * token_bytes
    print(
        f"feature cache: {len(lengths)} rows, {sum(lengths)} tokens, layers {layers} ({feature_dim} features, "
        f"{dtype}) -> expected {total / 2**30:.2f} GiB in {len(plan)} shards at {out}",
        file=sys.stderr,
    )
    old = read_manifest(out) if (out / MANIFEST).is_file() else None
    same_plan = old is not None and {k: v for k, v in old.items() if k != "complete"} == {
        k: v for k, v in manifest.items() if k != "complete"
    }
    if old is not None and not same_plan:
        raise UserError(
            f"{out} already holds a different feature cache; choose another data.features.out_dir or delete it"
        )
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MANIFEST, manifest)
    todo = [(s, a, b) for s, (a, b) in zip(manifest["shards"], plan) if not (out / s["file"]).is_file()]
    done_tokens = sum(lengths) - sum(sum(lengths[a:b]) for _, a, b in todo)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with tqdm(
        total=sum(lengths),
        initial=done_tokens,
        unit="tok",
        unit_scale=True,
        disable=not show_progress,
        desc="features",
    ) as bar:
        for shard, a, b in todo:
            tensors = encode_shard(
                model,
                [list(r) for r in input_ids[a:b]],
                [list(m) for m in loss_mask[a:b]],
                layers,
                dtype,
                batch_tokens,
                pad_id,
                topk,
                target_next,
                bar,
            )
            tensors["loss_mask"] = torch.tensor([t for m in loss_mask[a:b] for t in m], dtype=torch.uint8)
            meta = {"rows": f"{a}-{b}"}
            atomic_write(
                out / shard["file"], lambda tmp, t=tensors, m=meta: save_file(t, str(tmp), metadata=m)
            )
    manifest["complete"] = True
    write_json(out / MANIFEST, manifest)
    return manifest
