"""The feature cache's on-disk format: its folder layout, its manifest, and how the manifest is read.

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

The builder (:mod:`draftheads.data.cache.build`), the views over other caches
(:mod:`draftheads.data.cache.views`) and the reader (:mod:`draftheads.data.cache.read`) all go
through this module, so the file name, the version and the stored dtypes are said once.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.files import atomic_write

MANIFEST = "manifest.json"
CACHE_VERSION = 1
STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader never sees half a manifest)."""
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1)))


def read_manifest(directory: Path) -> dict:
    """The manifest of the cache in ``directory``; one line naming the fix when there is none."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise UserError(
            f"{directory} is not a feature cache (no {MANIFEST}); build one with `draftheads features`"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise UserError(f"{path} is corrupt; rebuild the cache with `draftheads features`") from None
