"""Wall-clock timing on a device: the median of short calls, and the tokens/s of a generation.

Both make one untimed call first (warm-up, lazy allocation, capture) and synchronise the device
around every timed call, so a CUDA time is the work's and not its launch's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn()`` in ms, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def timed_tokens_per_s(fn: Callable[[], object], device: torch.device, new: int) -> float:
    """Tokens/s of ``fn()`` (one call generating ``new`` tokens), after one untimed call."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return new / (time.perf_counter() - t0)
