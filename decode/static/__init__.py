"""The static-shape verify path: a fixed-capacity KV cache, padded trees, one CUDA graph per size.

A CUDA graph replays fixed kernels on fixed addresses, so everything the target's verify
forward reads or writes must keep its shape and storage from step to step:

* shapes.py: a tree of T nodes is padded to the next bucket size (1, 2, 4, ..., 64) with
  invalid nodes under the root, and its masks are built on the device;
* cache.py: the KV cache lives in per-layer buffers ``[B, heads, C, D]`` of a fixed capacity C
  (:class:`StaticKV`), leased from a pool that outlives a call;
* forward.py: the verify forward on static input buffers per (batch, bucket, capacity),
  captured once and replayed on ``decode.backend=cuda-graphs`` (:class:`StaticVerifier`);
* graphs.py: how a graph is captured, and the hook a drafter's fixed-shape pass plugs into
  (:class:`Graphs`).

The names below are this package's public face: ``from draftheads.decode import static`` and
``static.StaticVerifier``, ``static.Graphs``, ... as before the split into modules. The tunable
constants are not among them: read or patch them where they live (``shapes.BUCKETS``,
``shapes.MIN_CAPACITY``, ``graphs.WARMUP``), where the functions that use them look them up.
"""

from __future__ import annotations

from draftheads.decode.static.cache import KVPool, StaticKV, StaticLayer
from draftheads.decode.static.forward import (
    Entry,
    StaticVerifier,
    Verified,
    Warmup,
    hidden_request,
    shared,
    verifier,
)
from draftheads.decode.static.graphs import Graphs, drafter_graphs, record
from draftheads.decode.static.shapes import (
    ancestors,
    bucket,
    capacity_for,
    pad_ancestors,
    pad_tree,
    static_mask,
)

__all__ = [
    "Entry",
    "Graphs",
    "KVPool",
    "StaticKV",
    "StaticLayer",
    "StaticVerifier",
    "Verified",
    "Warmup",
    "ancestors",
    "bucket",
    "capacity_for",
    "drafter_graphs",
    "hidden_request",
    "pad_ancestors",
    "pad_tree",
    "record",
    "shared",
    "static_mask",
    "verifier",
]
