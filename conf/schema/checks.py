"""Range checks the typed configs run in ``__post_init__``.

``OmegaConf.to_object`` builds every config dataclass when a command's config is composed, so
a value checked here stops the command before it loads a model or writes a file; Python API
users who build the dataclasses themselves get the same check. Each failure is a one-line
:class:`UserError` that names the key, the value and what to use instead.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping

from draftheads.conf.errors import UserError

# how the target's and the drafter's linear layers run (``decode.backend``, ``data.distill.backend``)
BACKENDS = ("auto", "eager", "onednn", "cuda-graphs")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is shaped like a Hugging Face repository id, ``ORG/NAME``."""
    return HUB_ID.fullmatch(name) is not None


def at_least(key: str, value: int | float | None, low: int | float, example: object = None) -> None:
    """``value >= low`` (``None`` passes: the key is optional)."""
    if value is not None and value < low:
        hint = f" (e.g. {key}={example})" if example is not None else ""
        raise UserError(f"{key}={value} is out of range; use a value >= {low}{hint}")


def positive(key: str, value: int | float, example: object = None) -> None:
    """``value > 0``."""
    if value <= 0:
        hint = f" (e.g. {key}={example})" if example is not None else ""
        raise UserError(f"{key}={value} is out of range; use a value > 0{hint}")


def probability(key: str, value: float, example: object = None) -> None:
    """``value`` in ``(0, 1]``: a nucleus mass."""
    if not 0 < value <= 1:
        hint = f" (e.g. {key}={example})" if example is not None else ""
        raise UserError(f"{key}={value} is out of range; use a value in (0, 1]{hint}")


def fraction(key: str, value: float, example: object = None) -> None:
    """``value`` in ``[0, 1)``: a share of rows that leaves some behind."""
    if not 0 <= value < 1:
        hint = f" (e.g. {key}={example})" if example is not None else ""
        raise UserError(f"{key}={value} is out of range; use a value in [0, 1){hint}")


def one_of(key: str, value: object, choices: Iterable[object]) -> None:
    """``value`` is one of ``choices``; the message lists them all."""
    choices = list(choices)
    if value not in choices:
        raise UserError(f"{key}={value} is unknown; use one of {', '.join(str(c) for c in choices)}")


def backend_fits(key: str, backend: str, device: str, dtype: str) -> None:
    """Refuse a decoding backend that cannot run the target where and as it loads
    (``target.device``, ``target.dtype``), naming the key that chose it (``key``)."""
    if backend == "cuda-graphs" and not device.startswith("cuda"):
        raise UserError(
            f"{key}=cuda-graphs needs a CUDA device, but target.device={device}; "
            f"use {key}=auto (or target.device=cuda)"
        )
    if backend == "onednn" and device != "cpu":
        raise UserError(f"{key}=onednn runs on a CPU, but target.device={device}; use {key}=auto")
    if backend == "onednn" and dtype not in ("float32", "fp32"):
        raise UserError(
            f"{key}=onednn packs float32 weights, but target.dtype={dtype}; "
            f"use {key}=eager (or target.dtype=float32)"
        )


def nonfinite(value: object, key: str) -> tuple[str, float] | None:
    """The first NaN or infinite number in ``value`` as ``(key, number)``, or None.

    ``value`` is a number, a list or tuple, a mapping or a dataclass (its fields), walked with
    ``key`` as the dotted prefix (``decode.temperature``, ``data.mixture[0].weight``)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (key, value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, Mapping):
        items = ((str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        found = (nonfinite(v, f"{key}[{i}]") for i, v in enumerate(value))
        return next((f for f in found if f is not None), None)
    else:
        return None
    found = (nonfinite(v, f"{key}.{name}" if key else name) for name, v in items)
    return next((f for f in found if f is not None), None)


def schema_default(root: type, key: str) -> object:
    """The dataclass default of dotted ``key`` under dataclass type ``root`` (None: not a field with
    a default, e.g. a key inside a mapping or a list)."""
    value: object = root
    for part in key.split("."):
        kind = value if isinstance(value, type) else type(value)
        if not dataclasses.is_dataclass(kind):
            return None
        f = next((f for f in dataclasses.fields(kind) if f.name == part), None)
        if f is None:
            return None
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            return None
    return None if dataclasses.is_dataclass(value) else value


def finite(value: object, prefix: str = "", root: type | None = None) -> None:
    """Refuse a NaN or an infinity anywhere in ``value`` (a config, a section of one, or its
    plain-container form), naming the key: range checks written as ``x < 0`` let NaN through, so
    every float a command reads passes this one check first. ``root`` (the dataclass type
    ``value`` follows) supplies a default for the hint."""
    found = nonfinite(value, prefix.rstrip("."))
    if found is None:
        return
    key, number = found
    default = schema_default(root, key.removeprefix(prefix)) if root is not None else None
    hint = (
        f" (e.g. {key}={default})"
        if isinstance(default, (int, float)) and not isinstance(default, bool)
        else ""
    )
    raise UserError(f"{key}={number} is not a finite number; give a finite value{hint}")
