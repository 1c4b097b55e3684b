"""Execution backends: how the target's and the drafter's linear layers run while decoding.

On a CPU, PyTorch's default fp32 ``linear`` (MKL) costs about twice as much for 2-16 rows as
for one row, although the weights are read once either way; that makes verifying a tree
expensive. oneDNN with weights pre-packed into its blocked layout (what inductor's CPU weight
pre-packing does under ``torch.compile`` with freezing) keeps a 2-16 row call close to a
1-row one, and is faster for one row too.

* ``eager``: stock PyTorch, nothing changed.
* ``onednn``: every float32 ``nn.Linear`` of the given modules calls
  ``torch.ops.mkldnn._linear_pointwise`` on a weight packed with
  ``torch.ops.mkldnn._reorder_linear_weight``. CPU, float32, inference only.
* ``cuda-graphs``: on a CUDA device, the target's forward for each tree size is captured as a
  CUDA graph over a static KV cache (see :mod:`draftheads.decode.static`).
* ``auto``: for the decoder, the candidate measured fastest on this machine
  (:mod:`draftheads.decode.backend_choice`); :func:`resolve`, which times nothing (batched
  distillation), takes ``onednn`` on a float32 CPU model when oneDNN is available, ``eager``
  otherwise.

Lifetime. A :class:`Backend` is one call's: it packs the weights when it is made (a weight
replaced or changed in place through autograd during the call is packed again, a write through
``.data`` is seen by the next call) and holds the packed copies, about the float32 linear
weights' size again, until it is dropped. Given a :class:`PackCache` (a generator keeps one),
it takes the packing of an earlier call instead, after checking that each weight is unchanged
(storage, version and a probe of every row and column): packing costs about a second per call
on a small CPU target. The layers run packed only inside
``with backend.active():`` and only for the thread that entered it: the block installs a small
dispatcher on each layer (counted, so overlapping blocks share it and the last one out removes
it) and names its packed weights in a context variable, so any other thread, and any call
outside a block, runs the stock ``nn.Linear``. The decoder enters the block around each of its
phases, so a ``stream()`` suspended at a ``yield`` leaves every layer stock. The bias is read
from the layer at each call, never packed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import BACKENDS
from draftheads.decode.attention import grouped


class _Packed:
    """One layer's packed weight and the weight it was packed from (storage, version, shape)."""

    __slots__ = ("key", "weight", "probe")

    def __init__(self, m: nn.Linear) -> None:
        self.key, self.weight, self.probe = _weight_key(m), _pack(m), _probe(m.weight)

    def fresh(self, m: nn.Linear) -> bool:
        """Whether the layer's weight is still the one packed: same storage, version and probe."""
        return self.key == _weight_key(m) and torch.equal(self.probe, _probe(m.weight))

    def current(self, m: nn.Linear) -> torch.Tensor:
        """The packed weight, packed again first when the layer's weight is no longer the one packed."""
        key = _weight_key(m)
        if key != self.key:
            self.key, self.weight, self.probe = key, _pack(m), _probe(m.weight)
        return self.weight


# layer -> packed weight, for the blocks active in this thread (a copy per block, never mutated)
_ACTIVE: ContextVar[dict[nn.Linear, _Packed] | None] = ContextVar("draftheads_onednn_active", default=None)
# layer -> how many active blocks (in any thread) installed its dispatcher
_USERS: dict[nn.Linear, int] = {}
_LOCK = threading.Lock()


def onednn_available() -> bool:
    """Whether this torch build can pre-pack linear weights for oneDNN."""
    ops = getattr(torch.ops, "mkldnn", None)
    return bool(
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def resolve(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """The concrete backend for ``decode.backend=name`` on this device and dtype (never ``auto``)."""
    if name not in BACKENDS:
        raise UserError(f"decode.backend={name!r} is not a backend; use one of {', '.join(BACKENDS)}")
    if name == "auto":
        if device.type == "cpu" and dtype == torch.float32 and onednn_available():
            return "onednn"
        return "eager"
    if name == "onednn":
        if device.type != "cpu" or not onednn_available():
            raise UserError(
                f"decode.backend=onednn runs on a CPU with oneDNN, not on {device.type}; "
                "use decode.backend=auto or eager"
            )
        if dtype != torch.float32:
            raise UserError(
                f"decode.backend=onednn packs float32 weights, but the target is {dtype}; "
                "load it with target.dtype=float32 or use decode.backend=eager"
            )
    if name == "cuda-graphs" and device.type != "cuda":
        raise UserError(
            f"decode.backend=cuda-graphs needs a CUDA device, but the target is on {device.type}; "
            "use decode.backend=auto"
        )
    return name


def _weight_key(m: nn.Linear) -> tuple:
    w = m.weight
    return (w.data_ptr(), w._version, tuple(w.shape))


def _probe(w: torch.Tensor) -> torch.Tensor:
    """One element of every row and one of every column of ``w [out, in]``, at scattered offsets.

    A write through ``.data`` keeps the weight's storage and version, so a packing kept across
    calls is checked against these values at the start of each call: any update that touches
    every row or every column (a LoRA merge, a rescale, loading other weights, editing a row or a
    column) changes some of them. Reading them costs ``out + in`` elements, not the weight.
    """
    out, inp = w.shape
    rows = torch.arange(out, device=w.device)
    cols = torch.arange(inp, device=w.device)
    with torch.no_grad():
        return torch.cat([w[rows, (rows * 7919) % inp], w[(cols * 104729) % out, cols]]).clone()


class PackCache:
    """Packed weights kept across calls by their owner (a generator), checked at each call.

    Packing a model's weights costs about a second on a small CPU target, which a per-call
    packing would add to every ``generate``. The owner holds the copies (about the float32 linear
    weights' size again) until it is dropped or :meth:`clear` is called; a layer whose weight
    changed since (storage, version or probe) is packed again at the next call.
    """

    def __init__(self) -> None:
        self.entries: weakref.WeakKeyDictionary[nn.Linear, _Packed] = weakref.WeakKeyDictionary()

    def get(self, m: nn.Linear) -> _Packed:
        entry = self.entries.get(m)
        if entry is None or not entry.fresh(m):
            entry = self.entries[m] = _Packed(m)
        return entry

    def clear(self) -> None:
        self.entries.clear()


def _pack(m: nn.Linear) -> torch.Tensor:
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 1)


class _Dispatch:
    """A layer's ``forward`` while some block has it installed: packed for this thread's active
    block, stock otherwise (another thread, no block, autograd, a non-float32 input)."""

    def __init__(self, m: nn.Linear) -> None:
        self.m = m

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        entry = (_ACTIVE.get() or {}).get(m)
        grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, m.weight, m.bias)
        )
        if entry is None or grad or x.dtype != torch.float32:
            return nn.functional.linear(x, m.weight, m.bias)
        y = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, x.shape[-1]), entry.current(m), m.bias, "none", [], ""
        )
        return y.reshape(*x.shape[:-1], y.shape[-1])


def _install(m: nn.Linear) -> None:
    """Count one more active block on ``m``; the first one installs the dispatcher."""
    n = _USERS.get(m, 0)
    if n == 0:
        m.forward = _Dispatch(m)
    _USERS[m] = n + 1


def _uninstall(m: nn.Linear) -> None:
    """Count one block less on ``m``; the last one removes the dispatcher (the stock forward again)."""
    n = _USERS.pop(m) - 1
    if n:
        _USERS[m] = n
    else:
        m.__dict__.pop("forward", None)


def linears(*modules: nn.Module) -> list[nn.Linear]:
    """Every plain ``nn.Linear`` of ``modules`` on the CPU once (shared layers are counted once).

    Plain: its class computes ``nn.Linear.forward``. A subclass that returns something else (Llama-4's
    router returns scores and logits) keeps its own forward."""
    seen: dict[int, nn.Linear] = {}
    for mod in modules:
        for m in mod.modules():
            plain = isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward
            if plain and m.weight.device.type == "cpu":
                seen.setdefault(id(m), m)
    return list(seen.values())


def _packable(m: nn.Linear) -> bool:
    """A float32 layer whose ``forward`` nobody else replaced (an accelerate hook, say)."""
    own = m.__dict__.get("forward")
    return m.weight.dtype == torch.float32 and (own is None or isinstance(own, _Dispatch))


class Backend:
    """One call's backend: for ``onednn``, the modules' packed weights (made here, held until this
    object is dropped); :meth:`active` runs the modules on them. A block already active in this
    thread lends its packed weights (nothing is packed twice). On every backend the modules'
    grouped-query attention runs without copying its keys (:mod:`~draftheads.decode.attention`)."""

    def __init__(self, name: str, *modules: nn.Module, cache: PackCache | None = None) -> None:
        outer = _ACTIVE.get() or {}
        self.modules = modules
        self.packed: dict[nn.Linear, _Packed] = {}
        if name == "onednn":
            for m in linears(*modules):
                if _packable(m):
                    self.packed[m] = outer.get(m) or (cache.get(m) if cache is not None else _Packed(m))

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the modules on this backend inside the block, in this thread; exception-safe."""
        with grouped(*self.modules), self._packed():
            yield

    @contextmanager
    def _packed(self) -> Iterator[None]:
        """The packed weights installed inside the block (none: the modules as they are)."""
        if not self.packed:
            yield
            return
        held: list[nn.Linear] = []
        token = None
        try:
            with _LOCK:
                for m in self.packed:
                    _install(m)
                    held.append(m)
            token = _ACTIVE.set({**(_ACTIVE.get() or {}), **self.packed})
            yield
        finally:
            if token is not None:
                _ACTIVE.reset(token)
            with _LOCK:
                for m in held:
                    _uninstall(m)


@contextmanager
def applied(name: str, *modules: nn.Module, cache: PackCache | None = None) -> Iterator[None]:
    """Run ``modules`` on backend ``name`` (already resolved) inside the block, weights packed
    once at its start (or taken from ``cache``) and released at its end unless ``cache`` keeps
    them. Nested blocks reuse the outer block's packing. ``cuda-graphs`` changes no module (the
    decoder captures graphs itself)."""
    with Backend(name, *modules, cache=cache).active():
        yield


@contextmanager
def running(name: str, *modules: nn.Module) -> Iterator[str]:
    """Resolve ``name`` for the first module's device and dtype, run ``modules`` on it inside;
    yields the concrete backend. What a caller that is handed a model passes on (distillation)."""
    p = next(modules[0].parameters())
    chosen = resolve(name, p.device, p.dtype)
    with applied(chosen, *modules):
        yield chosen
