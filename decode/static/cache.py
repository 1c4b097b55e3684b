"""A transformers-compatible KV cache over fixed-capacity buffers, leased from a pool.

A captured graph holds the addresses of the buffers it reads and writes, so the cache lives in
per-layer buffers ``[B, heads, C, D]`` of a fixed capacity C that outlive a ``generate`` call,
pooled by (lease, key or value, layer, batch, capacity). Every live cache holds its own lease,
so two streams decoding at once (a server interleaving requests) never write into each other's
buffers; a lease returns to the pool when its cache is dropped, and the next call reuses its
buffers and the graphs captured on them.

The decoder's cache surgery (kv.py) works unchanged: a layer's ``keys`` / ``values`` show the
filled prefix of its buffer, and compaction scatters into that view in place; assigning a
prefix view sets the length, assigning a new tensor (rows that leave the batch) copies it into
the lease's buffer for the new batch size.
"""

from __future__ import annotations

import heapq
import weakref

import torch

from draftheads.decode.static.shapes import capacity_for


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
