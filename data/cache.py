"""Offline feature cache: run the frozen target once over a prepared dataset, read it back.

Layout of a cache directory::

    manifest.json          target fingerprint, layer ids, dtype, feature dim, token counts, shards
    shard-00000.safetensors
    ...

Each shard holds a contiguous range of dataset rows, flattened: ``offsets [n+1]`` (int64),
``input_ids [N]`` (int32), ``loss_mask [N]`` (uint8), ``features [N, F]`` (``dtype``), and
optionally ``target_next [N]`` (the target's argmax next token at each position, int32) and
``topk_ids / topk_logits [N, k]``: the target's top-k at the positions whose next token is
a loss token (what training reads; zeros elsewhere, as padding). Row ``i`` of the cache is row
``i`` of the dataset.

The builder batches rows of similar length (sorted within a shard, packed up to
``batch_tokens`` padded tokens per forward), prints the expected disk size before starting,
writes each shard atomically and resumes: a rerun with the same plan skips finished shards.
:class:`FeatureCache` refuses a cache built for another target or another layer set.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset

from draftheads.conf.errors import UserError
from draftheads.heads.checkpoint import atomic_write
from draftheads.heads.features import target_features
from draftheads.heads.target_fingerprint import TargetFingerprint, fingerprint

MANIFEST = "manifest.json"
CACHE_VERSION = 1
STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Row indices grouped by similar length, each group at most ``batch_tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, cur = [], []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * width > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def check_layers(layers: list[int], num_layers: int) -> list[int]:
    if not layers or any(not 0 <= i <= num_layers for i in layers):
        raise UserError(
            f"data.features.layers={layers}: layer ids must be in [0, {num_layers}] "
            f"({num_layers} is the final normed state)"
        )
    return list(layers)


def labelled(loss_mask: list[int]) -> list[bool]:
    """The positions whose next token is a loss token (``loss_mask[p + 1]``): where training
    reads the target's top-k as the label of the next token."""
    return [bool(m) for m in loss_mask[1:]] + [False]


@torch.no_grad()
def encode_shard(
    model,
    rows: list[list[int]],
    masks: list[list[int]],
    layers: list[int],
    dtype: str,
    batch_tokens: int,
    pad_id: int,
    topk: int,
    target_next: bool,
    progress,
) -> dict[str, torch.Tensor]:
    """Run the target over one shard's rows (length-bucketed batches) and flatten the results.

    The target's top-k is projected and stored only where training reads it (:func:`labelled`);
    every other position holds zeros, as padding does. ``target_next`` is stored everywhere, so
    with it the whole sequence is projected.
    """
    device = model.get_input_embeddings().weight.device  # a sharded target's: where its embedding is
    lengths = [len(r) for r in rows]
    feats: list[torch.Tensor | None] = [None] * len(rows)
    nexts: list[torch.Tensor | None] = [None] * len(rows)
    tk_ids: list[torch.Tensor | None] = [None] * len(rows)
    tk_val: list[torch.Tensor | None] = [None] * len(rows)
    for batch in length_batches(lengths, batch_tokens):
        width = max(lengths[i] for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        at = torch.zeros((len(batch), width), dtype=torch.bool)
        for j, i in enumerate(batch):
            ids[j, : lengths[i]] = torch.tensor(rows[i])
            attn[j, : lengths[i]] = 1
            at[j, : lengths[i]] = True if target_next else torch.tensor(labelled(masks[i]))
        at = at if target_next or topk else None
        f, logits = target_features(
            model, ids.to(device), attn.to(device), layers, logits_at=None if at is None else at.to(device)
        )
        f = f.to("cpu", STORE_DTYPES[dtype])
        if at is not None:
            lg = logits.float()
            nxt = lg.argmax(-1).to("cpu", torch.int32) if target_next else None
            v, k = lg.topk(topk, dim=-1) if topk else (None, None)
            ends = at.sum(1).cumsum(0).tolist()  # row j's positions are [ends[j-1], ends[j]) of lg
        for j, i in enumerate(batch):
            n = lengths[i]
            feats[i] = f[j, :n].clone()
            if at is None:
                continue
            lo, hi = (ends[j - 1] if j else 0), ends[j]
            if target_next:
                nexts[i] = nxt[lo:hi]
            if topk:
                sel = at[j, :n]
                tk_ids[i] = torch.zeros(n, topk, dtype=torch.int32)
                tk_val[i] = torch.zeros(n, topk, dtype=torch.float32)
                tk_ids[i][sel], tk_val[i][sel] = k[lo:hi].to("cpu", torch.int32), v[lo:hi].cpu()
        progress.update(sum(lengths[i] for i in batch))
    out = {
        "offsets": torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0),
        "input_ids": torch.tensor([t for r in rows for t in r], dtype=torch.int32),
        "features": torch.cat(feats).contiguous(),
    }
    if target_next:
        out["target_next"] = torch.cat(nexts)
    if topk:
        out["topk_ids"], out["topk_logits"] = torch.cat(tk_ids), torch.cat(tk_val)
    return out


def build_feature_cache(
    model,
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


def write_json(path: Path, obj: dict) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1)))


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise UserError(
            f"{directory} is not a feature cache (no {MANIFEST}); build one with `draftheads features`"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise UserError(f"{path} is corrupt; rebuild the cache with `draftheads features`") from None


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


class FeatureCache(Dataset):
    """A built feature cache as a torch Dataset of per-row dicts of tensors.

    Items: ``input_ids [T]`` and ``loss_mask [T]`` (int64), ``features [T, F]`` (stored dtype),
    and when stored ``target_next [T]`` (int64), ``topk_ids [T, k]`` (int64), ``topk_logits [T, k]``.
    Shards are memory-mapped; only the rows read are loaded. ``layers`` must be the stored ones,
    or with ``subset`` some of them (their feature columns are selected when a row is read).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        expected_fingerprint: TargetFingerprint | None = None,
        layers: list[int] | None = None,
        subset: bool = False,
    ) -> None:
        self.dir = Path(directory)
        self.manifest = read_manifest(self.dir)
        m = self.manifest
        if not m.get("complete"):
            raise UserError(
                f"feature cache {self.dir} is incomplete; rerun `draftheads features` to finish it"
            )
        if expected_fingerprint is not None:
            built = TargetFingerprint.from_dict(m["fingerprint"])
            bad = built.mismatches(expected_fingerprint)
            if bad:
                raise UserError(
                    f"feature cache {self.dir} was built for target {built.short()}, not "
                    f"{expected_fingerprint.short()} (mismatch: {', '.join(bad)}); rebuild it with "
                    "`draftheads features` for this target, or train with the target it was built for"
                )
        # with ``subset``, a cache of more layers serves some of them: the stored layers' feature
        # blocks to keep, in the order asked
        self.select: list[int] | None = None
        if layers is not None and list(layers) != m["layers"]:
            missing = [i for i in layers if i not in m["layers"]]
            if subset and missing:
                raise UserError(
                    f"feature cache {self.dir} holds layers {m['layers']}, not {missing} that the drafter reads "
                    f"({list(layers)}); rebuild it with `draftheads features` for this drafter, or set "
                    "draft.feature_layers to layers it holds"
                )
            if not subset:
                raise UserError(
                    f"feature cache {self.dir} holds layers {m['layers']} but the drafter reads {list(layers)}; "
                    "rebuild it with `draftheads features` for this drafter"
                )
            self.select = [m["layers"].index(i) for i in layers]
        self.starts = [s["rows"][0] for s in m["shards"]]
        self._handles: dict[int, object] = {}
        self._offsets: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.manifest["num_rows"]

    @property
    def layers(self) -> list[int]:
        return list(self.manifest["layers"])

    @property
    def fingerprint(self) -> TargetFingerprint:
        return TargetFingerprint.from_dict(self.manifest["fingerprint"])

    def _shard(self, k: int):
        if k not in self._handles:
            path = self.dir / self.manifest["shards"][k]["file"]
            if not path.is_file():
                raise UserError(
                    f"feature cache shard {path} is missing; rerun `draftheads features` to rebuild it"
                )
            self._handles[k] = safe_open(str(path), framework="pt")
            self._offsets[k] = self._handles[k].get_tensor("offsets")
        return self._handles[k], self._offsets[k]

    def columns(self) -> list[str]:
        """The per-token columns this cache stores."""
        names = ["input_ids", "loss_mask", "features"]
        names += ["target_next"] if self.manifest["target_next"] else []
        names += ["topk_ids", "topk_logits"] if self.manifest["topk"] else []
        return names

    def read(self, i: int, names: list[str]) -> dict[str, torch.Tensor]:
        """Columns ``names`` of row ``i``, read from the memory-mapped shard (nothing else is)."""
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = bisect.bisect_right(self.starts, i) - 1
        handle, offsets = self._shard(k)
        local = i - self.starts[k]
        a, b = int(offsets[local]), int(offsets[local + 1])
        item = {n: handle.get_slice(n)[a:b] for n in names}
        if self.select is not None and "features" in item:
            f = item["features"]
            blocks = f.view(f.shape[0], len(self.manifest["layers"]), -1)
            item["features"] = blocks[:, self.select].reshape(f.shape[0], -1)
        for n in ("input_ids", "loss_mask", "target_next", "topk_ids"):
            if n in item:
                item[n] = item[n].long()
        return item

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.read(i, self.columns())

    def view(self, names: list[str]) -> CacheColumns:
        """A dataset of only ``names`` per row (e.g. the token columns, without the features)."""
        return CacheColumns(self, names)


class CacheColumns(Dataset):
    """Some columns of a :class:`FeatureCache`, row by row, read lazily."""

    def __init__(self, cache: FeatureCache, names: list[str]) -> None:
        missing = [n for n in names if n not in cache.columns()]
        if missing:
            raise UserError(f"feature cache {cache.dir} has no {', '.join(missing)} column")
        self.cache, self.names = cache, list(names)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.cache.read(i, self.names)
