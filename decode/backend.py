"""Execution backends: how the target's and the drafter's linear layers run while decoding.

On a CPU, PyTorch's default fp32 ``linear`` (MKL) costs about twice as much for 2-16 rows as
for one row, although the weights are read once either way; that makes verifying a tree
expensive. oneDNN with weights pre-packed into its blocked layout (what inductor's CPU weight
pre-packing does under ``torch.compile`` with freezing) keeps a 2-16 row call close to a
1-row one, and is faster for one row too.

* ``eager``: stock PyTorch, nothing changed.
* ``onednn``: every ``nn.Linear`` of the given modules calls
  ``torch.ops.mkldnn._linear_pointwise`` on a weight packed once with
  ``torch.ops.mkldnn._reorder_linear_weight``. CPU, float32, inference only.
* ``cuda-graphs``: on a CUDA device, the target's forward for each tree size is captured as a
  CUDA graph over a static KV cache (see :mod:`draftheads.decode.static`).
* ``auto``: ``onednn`` on a float32 CPU model when oneDNN is available, ``eager`` otherwise.

The modules stay stock outside :func:`applied`: the backend is installed for a ``with`` block
and removed after it. Packed weights are cached beside the modules (not in them), keyed by the
weight's storage and version, so a weight that changes is packed again.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import BACKENDS

# Packed weights live outside the modules (a module that holds an opaque oneDNN tensor can no
# longer be deep-copied or saved): layer -> (weight storage and version, packed weight, bias).
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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


def _pack_key(m: nn.Linear) -> tuple:
    w = m.weight
    return (w.data_ptr(), w._version, w.dtype, tuple(w.shape))


def _packed_linear(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``m(x)`` through oneDNN with the packed weight; plain ``linear`` when autograd needs it."""
    if x.dtype != torch.float32 or (torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad)):
        return nn.functional.linear(x, m.weight, m.bias)
    key, packed, bias = _PACKED.get(m) or _pack(m)
    if key != _pack_key(m):
        key, packed, bias = _pack(m)
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _pack(m: nn.Linear) -> tuple:
    """Pack ``m``'s weight for oneDNN (once per weight storage and version)."""
    with torch.no_grad():
        entry = (
            _pack_key(m),
            torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 1),
            None if m.bias is None else m.bias.detach(),
        )
    _PACKED[m] = entry
    return entry


def _install(m: nn.Linear) -> None:
    entry = _PACKED.get(m)
    if entry is None or entry[0] != _pack_key(m):
        _pack(m)
    m.forward = partial(_packed_linear, m)


def linears(*modules: nn.Module) -> list[nn.Linear]:
    """Every ``nn.Linear`` of ``modules`` once (shared layers are counted once)."""
    seen: dict[int, nn.Linear] = {}
    for mod in modules:
        for m in mod.modules():
            if isinstance(m, nn.Linear) and m.weight.device.type == "cpu":
                seen.setdefault(id(m), m)
    return list(seen.values())


@contextmanager
def applied(name: str, *modules: nn.Module) -> Iterator[None]:
    """Run ``modules`` on backend ``name`` (already resolved) inside the block.

    Nested blocks are fine: a layer that is already installed is left to the outer block.
    ``cuda-graphs`` changes no module (the decoder captures graphs itself).
    """
    if name != "onednn":
        yield
        return
    mine = [m for m in linears(*modules) if "forward" not in m.__dict__]
    for m in mine:
        _install(m)
    try:
        yield
    finally:
        for m in mine:
            m.__dict__.pop("forward", None)


@contextmanager
def running(name: str, *modules: nn.Module) -> Iterator[str]:
    """Resolve ``name`` for the first module's device and dtype, run ``modules`` on it inside;
    yields the concrete backend. What a caller that is handed a model passes on (distillation)."""
    p = next(modules[0].parameters())
    chosen = resolve(name, p.device, p.dtype)
    with applied(chosen, *modules):
        yield chosen


def release(*modules: nn.Module) -> None:
    """Drop cached packed weights (memory) from ``modules``' linear layers."""
    for m in linears(*modules):
        _PACKED.pop(m, None)
