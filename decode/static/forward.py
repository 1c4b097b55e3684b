"""The target's verify forward on static shapes: :class:`StaticVerifier`, and which one a
generator uses.

A step's tree is padded to its bucket (shapes.py), the prefill's cache is copied into a leased
:class:`StaticKV` (cache.py), and token ids, positions, the additive mask ``[B, 1, T, C]`` and
the write index are copied into static buffers per (batch, bucket, capacity, hidden layers,
lease); the forward then runs on those buffers. On a CUDA device (``decode.backend=cuda-graphs``)
each such shape is captured once as a CUDA graph (graphs.py), all in one memory pool, and
replayed; :meth:`StaticVerifier.prepare` captures a call's graphs before it, largest first. On
any other device the same buffers feed an eager forward (``capture=False``), which is how the
tests check this path against the DynamicCache one. One verifier serves every generator of a
model (:func:`shared`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.decode.static import shapes
from draftheads.decode.static.cache import KVPool, StaticKV
from draftheads.decode.static.graphs import record
from draftheads.decode.tree import Tree
from draftheads.heads.masks import layer_kinds


def hidden_request(layers: tuple[int, ...] | bool) -> list[int] | bool:
    """The ``output_hidden_states`` a forward passes to keep only ``layers`` of the target's
    ``hidden_states`` tuple: transformers (5.24+) then records those indices and leaves None at
    the others, the tuple's length and indexing unchanged; a model that reads the flag as a bool
    returns every state, which indexes the same. No layers: False; a bool passes as it is."""
    if isinstance(layers, bool):
        return layers
    return sorted(set(layers)) or False


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
    mask: torch.Tensor | dict[str, torch.Tensor]  # one per layer kind when the kinds differ
    write: torch.Tensor
    graph: object = None
    out: object = None
    runs: int = field(default=0)


def mask_buffers(
    config, shape: tuple[int, ...], dtype: torch.dtype, device
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The static mask input of a verify forward: one buffer, or one per layer kind when the
    target's kinds differ (:func:`~draftheads.heads.masks.target_attention_mask`'s form)."""
    kinds = list(dict.fromkeys(layer_kinds(config)))
    if len(kinds) == 1:
        return torch.zeros(shape, dtype=dtype, device=device)
    return {kind: torch.zeros(shape, dtype=dtype, device=device) for kind in kinds}


def masks_of(mask: torch.Tensor | dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The mask's tensors in kind order (one, or each kind's)."""
    return list(mask.values()) if isinstance(mask, dict) else [mask]


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
        size = shapes.bucket(T)
        if not isinstance(state.cache, StaticKV):
            state.cache = StaticKV.adopt(state.cache, self.pool, shapes.BUCKETS[-1] + 1)
        cache = state.cache
        S = int(state.kv_valid.shape[1])
        if S + size > cache.capacity:
            self.pool.capacity = shapes.capacity_for(S + size)
            cache.resize(self.pool.capacity)
        layers = tuple(sorted(set(layers)))
        entry = self._entry(B, size, cache.capacity, layers, cache.lease)
        padded = shapes.pad_tree(tree, size)
        entry.ids.copy_(padded.tokens)
        entry.pos.copy_(state.pos[:, None] + padded.depths)
        padded_anc = shapes.pad_ancestors(anc, size)
        mask = shapes.static_mask(
            state.kv_valid, padded_anc, cache.capacity, self.dtype, self.target.config, entry.pos
        )
        for buffer, value in zip(masks_of(entry.mask), masks_of(mask)):
            buffer.copy_(value)
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
                mask_buffers(self.target.config, (B, 1, size, capacity), self.dtype, dev),
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
            entry.graph, entry.out = record(self.device, self.mempool, self.forward, entry, cache, layers)
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
        self.pool.capacity = max(self.pool.capacity, shapes.capacity_for(context + shapes.BUCKETS[-1] + 1))
        for rows in range(batch, 0, -1):
            prompt = DynamicCache()
            ids = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
            self.target(input_ids=ids, cache=prompt, use_cache=True, logits_to_keep=1)
            state = Warmup(prompt, torch.ones_like(ids, dtype=torch.bool), torch.ones_like(ids[:, 0]))
            for size in sorted(shapes.BUCKETS, reverse=True):
                parents = torch.zeros(rows, size, dtype=torch.long, device=self.device)
                depths = torch.ones_like(parents)
                depths[:, 0] = 0
                ones = torch.ones(rows, size, device=self.device)
                tree = Tree(parents, parents, depths, ones, ones.bool())
                self(state, tree, shapes.ancestors(parents), layers)
                state.cache.set_length(1)
        return len(self.entries) - before


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
