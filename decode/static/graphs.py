"""CUDA graph capture: one warm-up-and-capture recipe, and the hook a drafter's fixed-shape pass
plugs into.

A graph is captured after ``WARMUP`` runs on a side stream (so lazy initialisation and the
allocator's first requests happen outside it), into a memory pool its owner shares among all
its graphs. :class:`Graphs` replays one graph per shape key for a drafter: a level-by-level
tree expansion, a block drafter's single pass. Off CUDA (``capture=False``) the same callables run
eagerly, which is how the tests check them on CPU.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.decode.static.cache import KVPool

WARMUP = 2


def record(device: torch.device, mempool: object, fn: Callable, *args) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn(*args)`` warmed up on a side stream, then captured into ``mempool``: the graph and the
    outputs of the captured call (static buffers its replays overwrite)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            fn(*args)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=mempool):
        out = fn(*args)
    return graph, out


class Graphs:
    """Fixed-shape callables replayed as CUDA graphs, one per shape key: the hook a drafter's
    fixed-shape pass plugs into (a level-by-level tree expansion, a block drafter's single pass).

    ``run(key, fn, *inputs)`` calls ``fn(*inputs)``. With ``capture``, the first call for a key
    copies the tensor ``inputs`` into static buffers, warms ``fn`` up on a side stream and
    captures it; later calls copy the inputs in and replay. So ``fn`` must read and write only
    its inputs and state whose addresses the key fixes (a lease's cache buffers: put the lease,
    batch and capacity in the key), never read a value on the host, and its outputs are only
    valid until the next call for that key. Without ``capture`` (any device) ``fn`` just runs.
    """

    def __init__(self, device: torch.device, capture: bool | None = None) -> None:
        self.device = device
        self.capture = (device.type == "cuda") if capture is None else capture
        if self.capture and device.type != "cuda":
            raise UserError(f"CUDA graphs need a CUDA device, not {device.type}; use decode.backend=auto")
        self.pool = KVPool()  # a drafter's own cache buffers, leased per stream
        self.mempool = torch.cuda.graph_pool_handle() if self.capture else None
        self.entries: dict[tuple, tuple] = {}  # key -> (static inputs, graph, outputs)
        self.capture_s = 0.0

    def run(self, key: tuple, fn: Callable, *inputs: torch.Tensor):
        if not self.capture:
            return fn(*inputs)
        if key not in self.entries:
            t0 = time.perf_counter()
            held = [x.clone() for x in inputs]
            graph, out = record(self.device, self.mempool, fn, *held)
            self.entries[key] = (held, graph, out)
            self.capture_s += time.perf_counter() - t0
        held, graph, out = self.entries[key]
        for mine, x in zip(held, inputs):
            mine.copy_(x)
        graph.replay()
        return out


_DRAFT_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def drafter_graphs(drafter: nn.Module, capture: bool | None = None) -> Graphs:
    """The :class:`Graphs` every proposer of ``drafter`` uses (made on first use, dropped with it)."""
    mine = _DRAFT_GRAPHS.setdefault(drafter, {})
    device = next(drafter.parameters()).device
    key = (device.type == "cuda") if capture is None else capture
    if key not in mine:
        mine[key] = Graphs(device, capture=key)
    return mine[key]
