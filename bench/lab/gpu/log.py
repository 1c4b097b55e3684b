"""The check's output: flushed lines, timestamps since the start, and sections that fail alone.

Every line is flushed, so a log piped through ``tee`` holds everything up to a timeout; a
section that raises prints its traceback and returns None, and the next section still runs.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T0 = time.perf_counter()
R = TypeVar("R")


def say(*args: object) -> None:
    print(*args, flush=True)


def stamp() -> str:
    return f"[{time.perf_counter() - T0:7.1f} s]"


def section(title: str, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R | None:
    """Run one section: a timestamped header, its traceback on failure (the rest still run)."""
    say(f"\n== {title} == {stamp()}")
    try:
        return fn(*args, **kwargs)
    except Exception:
        say(traceback.format_exc().rstrip())
        say(f"!! section failed: {title}")
        return None
    finally:
        memory = ""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            memory = f", max_memory_allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
            torch.cuda.reset_peak_memory_stats()
        say(f"   ({title} done {stamp()}{memory})")
