"""The static-shape verify path: a fixed-capacity KV cache, padded trees, one CUDA graph per size.

A CUDA graph replays fixed kernels on fixed addresses, so everything the target's verify
forward reads or writes must keep its shape and storage from step to step:

* the KV cache lives in per-layer buffers ``[B, heads, C, D]`` of a fixed capacity C
  (:class:`StaticKV`); a forward writes its T new entries at slots ``[S, S + T)`` through a
  static index tensor and attends over all C slots, the unused ones masked;
* a tree of T nodes is padded to the next bucket size (1, 2, 4, ..., 64) with invalid nodes
  under the root (never accepted; their outputs are cut off before acceptance);
* token ids, positions, the additive mask ``[B, 1, T, C]`` and the write index sit in static
  buffers per (batch, bucket, capacity); a step copies its inputs into them and replays.

On a CUDA device (``decode.backend=cuda-graphs``) each (batch, bucket, capacity) is captured
once with :class:`torch.cuda.CUDAGraph` after a warm-up on a side stream; all graphs share one
memory pool. :meth:`StaticVerifier.prepare` captures a call's graphs before it, largest first. On any other device the same buffers feed an eager forward (``capture=False``),
which is how the tests check this path against the DynamicCache one.

The buffers outlive a ``generate`` call (a graph holds their addresses), pooled by (lease,
layer, batch, capacity). Every live cache holds its own lease, so two streams decoding at once
(a server interleaving requests) never write into each other's buffers; a lease returns to the
pool when its cache is dropped, and the next call reuses its buffers and the graphs captured on
them. One verifier serves every generator of a model (:func:`shared`). The decoder's cache
surgery (kv.py) works unchanged: a layer's ``keys`` / ``values`` show the filled prefix of its
buffer, and compaction scatters into that view in place; assigning a prefix view sets the
length, assigning a new tensor (rows that leave the batch) copies it into the lease's buffer
for the new batch size.
"""

from __future__ import annotations

import heapq
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.decode.tree import Tree
from draftheads.heads.masks import additive_mask

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_CAPACITY = 256
WARMUP = 2


def bucket(n: int) -> int:
    """The padded tree size for ``n`` nodes: the next bucket, or the next multiple of 64 past them."""
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // BUCKETS[-1]) * BUCKETS[-1]


def capacity_for(n: int) -> int:
    """Cache slots for ``n`` tokens: the next power of two, at least ``MIN_CAPACITY``."""
    c = MIN_CAPACITY
    while c < n:
        c *= 2
    return c


def pad_tree(tree: Tree, size: int) -> Tree:
    """``tree`` with invalid nodes appended under the root up to ``size`` nodes (token = root's)."""
    B, T = tree.tokens.shape
    pad = size - T
    if pad <= 0:
        return tree
    col = lambda t, v: torch.full((B, pad), v, dtype=t.dtype, device=t.device)  # noqa: E731
    return Tree(
        torch.cat([tree.tokens, tree.tokens[:, :1].expand(B, pad)], 1),
        torch.cat([tree.parents, col(tree.parents, 0)], 1),
        torch.cat([tree.depths, col(tree.depths, 1)], 1),
        torch.cat([tree.scores, col(tree.scores, 0.0)], 1),
        torch.cat([tree.valid, col(tree.valid, False)], 1),
    )


def pad_ancestors(anc: torch.Tensor, size: int) -> torch.Tensor:
    """``[B, T, T]`` ancestor mask grown to ``size`` nodes: a padding node sees the root and itself."""
    B, T, _ = anc.shape
    out = torch.zeros(B, size, size, dtype=torch.bool, device=anc.device)
    out[:, :T, :T] = anc
    i = torch.arange(T, size, device=anc.device)
    out[:, i, 0] = True
    out[:, i, i] = True
    return out


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """``anc[.., i, j]``: node j is node i or one of its ancestors (as ``tree.ancestor_mask``),
    without reading the tree's depth on the host. With P the parent relation (the root has
    none), R = I | P squared ceil(log2(T - 1)) times reaches along every path of up to T - 1
    edges, the deepest a T-node tree has."""
    T = parents.shape[-1]
    idx = torch.arange(T, device=parents.device)
    reach = ((parents[..., :, None] == idx) & (idx[:, None] > 0)) | (idx[:, None] == idx)
    for _ in range(max(T - 1, 1).bit_length()):
        r = reach.float()
        reach = (r @ r) > 0
    return reach


def hidden_request(layers: tuple[int, ...] | bool) -> list[int] | bool:
    """The ``output_hidden_states`` a forward passes to keep only ``layers`` of the target's
    ``hidden_states`` tuple: transformers (5.24+) then records those indices and leaves None at
    the others, the tuple's length and indexing unchanged; a model that reads the flag as a bool
    returns every state, which indexes the same. No layers: False; a bool passes as it is."""
    if isinstance(layers, bool):
        return layers
    return sorted(set(layers)) or False


def static_mask(kv_valid: torch.Tensor, anc: torch.Tensor, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive ``[B, 1, T, capacity]``: the row's valid cache slots, then the tree's ancestors
    at slots ``[S, S + T)``; every other slot is masked."""
    B, T, _ = anc.shape
    S = kv_valid.shape[1]
    allowed = torch.zeros(B, T, capacity, dtype=torch.bool, device=anc.device)
    allowed[:, :, :S] = kv_valid[:, None, :]
    allowed[:, :, S : S + T] = anc
    return additive_mask(allowed, dtype)


class StaticLayer:
    """One layer's keys and values in fixed-capacity buffers; ``keys``/``values`` are the filled
    prefix ``[B, heads, length, D]`` (views: in-place writes reach the buffers)."""

    def __init__(self, pool: KVPool, index: int, lease: int) -> None:
        self.pool, self.index, self.lease = pool, index, lease
        self.filled = {"k_buf": 0, "v_buf": 0}  # kept apart: kv.py assigns keys, then values
        self.k_buf: torch.Tensor | None = None
        self.v_buf: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.filled["k_buf"]

    @length.setter
    def length(self, n: int) -> None:
        self.filled = {"k_buf": n, "v_buf": n}

    def _get(self, name: str) -> torch.Tensor:
        return getattr(self, name)[:, :, : self.filled[name]]

    def _set(self, name: str, t: torch.Tensor) -> None:
        """A prefix view of the buffer sets the length; any other tensor is copied into the lease's
        buffer for its batch size (and the current capacity)."""
        buf = getattr(self, name)
        if buf is not None and t.data_ptr() == buf.data_ptr() and t.stride() == buf.stride():
            if t.shape[:2] == buf.shape[:2] and t.shape[3] == buf.shape[3]:
                self.filled[name] = int(t.shape[2])
                return
        capacity = self.pool.capacity if buf is None else int(buf.shape[2])
        new = self.pool.buffer(self.lease, name, self.index, t, capacity)
        new[:, :, : t.shape[2]].copy_(t)
        setattr(self, name, new)
        self.filled[name] = int(t.shape[2])

    keys = property(lambda self: self._get("k_buf"), lambda self, t: self._set("k_buf", t))
    values = property(lambda self: self._get("v_buf"), lambda self, t: self._set("v_buf", t))

    def resize(self, capacity: int) -> None:
        """Move the filled prefix into the pool's buffers of another capacity."""
        for name in ("k_buf", "v_buf"):
            old = getattr(self, name)
            new = self.pool.buffer(self.lease, name, self.index, old, capacity)
            new[:, :, : self.length].copy_(old[:, :, : self.length])
            setattr(self, name, new)


class KVPool:
    """Cache buffers by (lease, key or value, layer, batch, capacity), kept across calls (graphs
    hold them). A lease is a small integer a live cache owns; released ones are handed out again
    lowest first, so sequential calls keep reusing lease 0's buffers."""

    def __init__(self) -> None:
        self.capacity = capacity_for(0)
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.free: list[int] = []  # a heap of released leases
        self.leases = 0  # leases handed out so far

    def lease(self) -> int:
        """A lease no live cache holds."""
        if self.free:
            return heapq.heappop(self.free)
        self.leases += 1
        return self.leases - 1

    def release(self, lease: int) -> None:
        heapq.heappush(self.free, lease)

    def buffer(self, lease: int, name: str, layer: int, like: torch.Tensor, capacity: int) -> torch.Tensor:
        B, H, _, D = like.shape
        key = (lease, name, layer, B, H, D, capacity, like.dtype, like.device)
        if key not in self.buffers:
            self.buffers[key] = torch.zeros(B, H, capacity, D, dtype=like.dtype, device=like.device)
        return self.buffers[key]


class StaticKV:
    """A transformers-compatible cache over fixed-capacity buffers (``update`` as a model calls it).

    ``write_index`` (a static ``[T]`` long tensor) says where the next forward's T entries go;
    ``update`` returns the whole buffers, so attention always spans all ``capacity`` slots
    (fixed shapes, what a CUDA graph needs), or only the first ``span`` slots when a caller
    without graphs sets it (attention then costs what the filled slots cost).

    It holds one lease of ``pool`` for its lifetime (released when it is garbage collected, i.e.
    when the call that decodes with it ends or its stream is dropped).
    """

    def __init__(self, pool: KVPool, num_layers: int) -> None:
        self.lease = pool.lease()
        weakref.finalize(self, pool.release, self.lease)
        self.layers = [StaticLayer(pool, i, self.lease) for i in range(num_layers)]
        self.write_index: torch.Tensor | None = None
        self.span: int | None = None

    @classmethod
    def adopt(cls, cache, pool: KVPool, extra: int) -> StaticKV:
        """Copy a filled cache (the prefill's DynamicCache) into leased buffers with room for ``extra``."""
        layers = cache.layers
        pool.capacity = max(pool.capacity, capacity_for(int(layers[0].keys.shape[2]) + extra))
        out = cls(pool, len(layers))
        for mine, theirs in zip(out.layers, layers):
            mine.keys, mine.values = theirs.keys, theirs.values
        return out

    @property
    def capacity(self) -> int:
        return int(self.layers[0].k_buf.shape[2])

    @property
    def batch(self) -> int:
        return int(self.layers[0].k_buf.shape[0])

    def set_length(self, n: int) -> None:
        for layer in self.layers:
            layer.length = n

    def resize(self, capacity: int) -> None:
        for layer in self.layers:
            layer.resize(capacity)

    def ensure(self, needed: int) -> None:
        """Grow every layer (and the pool's default) to a capacity that holds ``needed`` slots."""
        if needed > self.capacity:
            self.layers[0].pool.capacity = max(self.layers[0].pool.capacity, capacity_for(needed))
            self.resize(capacity_for(needed))

    def crop(self, tokens_to_remove: int) -> None:
        """``DynamicCache.crop``: drop the last ``-tokens_to_remove`` filled slots (0: nothing)."""
        self.set_length(self.get_seq_length() - abs(tokens_to_remove))

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        """``DynamicCache.batch_select_indices``: keep only ``rows`` (copied into the lease's buffers)."""
        for layer in self.layers:
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the new entries at ``write_index``; return the full buffers."""
        layer = self.layers[layer_idx]
        layer.k_buf.index_copy_(2, self.write_index, keys)
        layer.v_buf.index_copy_(2, self.write_index, values)
        if self.span is not None:
            return layer.k_buf[:, :, : self.span], layer.v_buf[:, :, : self.span]
        return layer.k_buf, layer.v_buf

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].length


@dataclass
class Verified:
    """The target's outputs at the real tree nodes (padding cut off)."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None


@dataclass
class Warmup:
    """The part of a decoding state a verify call reads, for :meth:`StaticVerifier.prepare`."""

    cache: object
    kv_valid: torch.Tensor
    pos: torch.Tensor


@dataclass
class Entry:
    """Static inputs of one (batch, bucket, capacity, hidden layers, lease) shape, and its graph."""

    ids: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    write: torch.Tensor
    graph: object = None
    out: object = None
    runs: int = field(default=0)


class StaticVerifier:
    """The target's verify forward on static shapes; ``capture`` records CUDA graphs (CUDA only).

    It holds the target weakly, so the model-level registry (:func:`shared`) does not keep a
    model alive. Inputs, outputs and graphs are per (batch, bucket, capacity, hidden layers,
    lease): a graph reads and writes its lease's buffers only, and returns the requested layers'
    states alone (:func:`hidden_request`).
    """

    def __init__(self, target: nn.Module, capture: bool | None = None) -> None:
        p = next(target.parameters())
        self._target = weakref.ref(target)
        self.device, self.dtype = p.device, p.dtype
        self.capture = (self.device.type == "cuda") if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise UserError(
                f"CUDA graphs need a CUDA device, but the target is on {self.device.type}; "
                "use decode.backend=auto"
            )
        self.pool = KVPool()
        self.entries: dict[tuple, Entry] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.capture else None

    @property
    def target(self) -> nn.Module:
        return self._target()

    def __call__(self, state, tree: Tree, anc: torch.Tensor, layers: tuple[int, ...] = ()) -> Verified:
        """Verify ``tree`` for the active rows of ``state``; ``state.cache`` becomes a StaticKV.
        ``layers``: the indices of the target's ``hidden_states`` to return (None at the others).

        After the call the cache holds ``S + bucket`` filled slots (the tree's entries after the
        ``S`` old ones), as a DynamicCache would hold ``S + T``; compaction then keeps the path.
        """
        B, T = tree.tokens.shape
        size = bucket(T)
        if not isinstance(state.cache, StaticKV):
            state.cache = StaticKV.adopt(state.cache, self.pool, BUCKETS[-1] + 1)
        cache = state.cache
        S = int(state.kv_valid.shape[1])
        if S + size > cache.capacity:
            self.pool.capacity = capacity_for(S + size)
            cache.resize(self.pool.capacity)
        layers = tuple(sorted(set(layers)))
        entry = self._entry(B, size, cache.capacity, layers, cache.lease)
        padded = pad_tree(tree, size)
        entry.ids.copy_(padded.tokens)
        entry.pos.copy_(state.pos[:, None] + padded.depths)
        entry.mask.copy_(static_mask(state.kv_valid, pad_ancestors(anc, size), cache.capacity, self.dtype))
        entry.write.copy_(torch.arange(S, S + size, device=self.device))
        cache.write_index = entry.write
        if self.capture:
            out = self._replay(entry, cache, layers)
        else:
            out = self.forward(entry, cache, layers)
        entry.runs += 1
        cache.set_length(S + size)
        states = tuple(h if h is None else h[:, :T] for h in out.hidden_states) if layers else None
        return Verified(out.logits[:, :T], states)

    def _entry(self, B: int, size: int, capacity: int, layers: tuple[int, ...] | bool, lease: int) -> Entry:
        key = (B, size, capacity, layers, lease)
        if key not in self.entries:
            dev = self.device
            self.entries[key] = Entry(
                torch.zeros(B, size, dtype=torch.long, device=dev),
                torch.zeros(B, size, dtype=torch.long, device=dev),
                torch.zeros(B, 1, size, capacity, dtype=self.dtype, device=dev),
                torch.arange(size, dtype=torch.long, device=dev),
            )
        return self.entries[key]

    def forward(self, entry: Entry, cache: StaticKV, layers: tuple[int, ...] | bool):
        """The target's forward on this entry's static inputs: what a graph captures (``layers``
        as :func:`hidden_request` takes them)."""
        return self.target(
            input_ids=entry.ids,
            attention_mask=entry.mask,
            position_ids=entry.pos,
            cache=cache,
            use_cache=True,
            output_hidden_states=hidden_request(layers),
        )

    def _replay(self, entry: Entry, cache: StaticKV, layers: tuple[int, ...] | bool):
        """Capture this shape's graph the first time (after a warm-up), then replay it."""
        if entry.graph is None:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    self.forward(entry, cache, layers)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                entry.out = self.forward(entry, cache, layers)
            entry.graph = graph
        entry.graph.replay()
        return entry.out

    def graphs(self) -> int:
        """CUDA graphs captured so far."""
        return sum(e.graph is not None for e in self.entries.values())

    def prepare(self, batch: int, context: int, layers: tuple[int, ...] = ()) -> int:
        """Make the verify entries (and, with ``capture``, their graphs) a call of up to ``context``
        tokens (prompt and new ones) over ``batch`` rows will use, before it runs: every bucket,
        largest first, for ``batch`` rows down to one (rows leave the batch as they finish), at
        the capacity such a call verifies at, on the lease the next call takes. Largest first: a
        smaller graph's private memory then comes out of the pool a larger one left. Returns
        how many entries it made."""
        from transformers import DynamicCache

        before = len(self.entries)
        # adopt() makes the prompt's capacity at least capacity_for(prompt + BUCKETS[-1] + 1);
        # a step verifies at most BUCKETS[-1] nodes after at most ``context`` - 1 slots
        self.pool.capacity = max(self.pool.capacity, capacity_for(context + BUCKETS[-1] + 1))
        for rows in range(batch, 0, -1):
            prompt = DynamicCache()
            ids = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
            self.target(input_ids=ids, cache=prompt, use_cache=True, logits_to_keep=1)
            state = Warmup(prompt, torch.ones_like(ids, dtype=torch.bool), torch.ones_like(ids[:, 0]))
            for size in sorted(BUCKETS, reverse=True):
                parents = torch.zeros(rows, size, dtype=torch.long, device=self.device)
                depths = torch.ones_like(parents)
                depths[:, 0] = 0
                ones = torch.ones(rows, size, device=self.device)
                tree = Tree(parents, parents, depths, ones, ones.bool())
                self(state, tree, ancestors(parents), layers)
                state.cache.set_length(1)
        return len(self.entries) - before


class Graphs:
    """Fixed-shape callables replayed as CUDA graphs, one per shape key: the hook a drafter's
    fixed-shape pass plugs into (the EAGLE tree expansion, a block drafter's single pass).

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

    def run(self, key: tuple, fn, *inputs: torch.Tensor):
        if not self.capture:
            return fn(*inputs)
        if key not in self.entries:
            t0 = time.perf_counter()
            held = [x.clone() for x in inputs]
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    fn(*held)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                out = fn(*held)
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


# one verifier per (model, capture): generators of a model share its buffers and graphs
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared(target: nn.Module, capture: bool | None = None) -> StaticVerifier:
    """The verifier every generator of ``target`` uses (made on first use, dropped with the model)."""
    mine = _SHARED.setdefault(target, {})
    key = (next(target.parameters()).device.type == "cuda") if capture is None else capture
    if key not in mine:
        mine[key] = StaticVerifier(target, capture=key)
    return mine[key]


def verifier(gen) -> StaticVerifier | None:
    """The static verifier of a SpeculativeGenerator: its ``static_verifier`` when set (tests set
    one with ``capture=False`` on CPU), the model's shared capturing one on
    ``decode.backend=cuda-graphs``, else None (the DynamicCache path)."""
    own = getattr(gen, "static_verifier", None)
    if own is not None:
        return own
    if gen.backend != "cuda-graphs":
        return None
    return shared(gen.target, capture=True)
