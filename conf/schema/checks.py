"""Range checks the typed configs run in ``__post_init__``.

``OmegaConf.to_object`` builds every config dataclass when a command's config is composed, so
a value checked here stops the command before it loads a model or writes a file; Python API
users who build the dataclasses themselves get the same check. Each failure is a one-line
:class:`UserError` that names the key, the value and what to use instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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
