"""Read a built feature cache back: a torch Dataset of per-row tensors, memory-mapped.

:class:`FeatureCache` refuses, in one line each, an incomplete cache, a cache built for another
target and one built for another layer set (or, with ``subset``, one lacking a layer the drafter
reads); :class:`CacheColumns` reads only some columns of it (e.g. the tokens, without the
features). The folder's format is :mod:`draftheads.data.cache.manifest`'s; caches are written by
:mod:`draftheads.data.cache.build` and :mod:`draftheads.data.cache.views`.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch.utils.data import Dataset

from draftheads.conf.errors import UserError
from draftheads.data.cache.manifest import read_manifest
from draftheads.heads.target.fingerprint import TargetFingerprint


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
                    "the drafter's feature_layers (draft.<kind>.feature_layers) to layers it holds"
                )
            if not subset:
                raise UserError(
                    f"feature cache {self.dir} holds layers {m['layers']} but the drafter reads {list(layers)}; "
                    "rebuild it with `draftheads features` for this drafter"
                )
            self.select = [m["layers"].index(i) for i in layers]
        self.starts = [s["rows"][0] for s in m["shards"]]
        self._handles: dict[int, safe_open] = {}
        self._offsets: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.manifest["num_rows"]

    @property
    def layers(self) -> list[int]:
        return list(self.manifest["layers"])

    @property
    def fingerprint(self) -> TargetFingerprint:
        return TargetFingerprint.from_dict(self.manifest["fingerprint"])

    def _shard(self, k: int) -> tuple[safe_open, torch.Tensor]:
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
