"""The verify-cost model on disk: measured once per set-up, before any timed work, then read.

One JSON file per set-up (model, dtype, backend, device, thread count, attention), named by
:func:`cache_file_name` so two set-ups never overwrite each other. A file is used only when its
key equals this set-up's and its numbers are sound; any other file (unreadable, not JSON, a
NaN or a falling curve, another device or thread count) is said in one line on stderr, then
measured again. Measuring is announced, with how long it took, so that a user knows why the
first construction of a decoder pauses; no ``generate`` call ever measures.

:func:`read_record` is the one validation every timing cache of the decoder reads through (the
backend choice's too, :mod:`draftheads.decode.backend_choice`).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from draftheads.decode.cost import (
    CONTEXT_BUCKET,
    CostCurve,
    CostModel,
    measure_model,
    model_forwards,
    model_key,
)
from draftheads.heads.files import atomic_write


def default_cache_dir() -> Path:
    """``$DRAFTHEADS_COST_CACHE``, else ``$XDG_CACHE_HOME/draftheads/cost``."""
    if os.environ.get("DRAFTHEADS_COST_CACHE"):
        return Path(os.environ["DRAFTHEADS_COST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "draftheads" / "cost"


def cache_file_name(key: dict) -> str:
    """One file per set-up: model, dtype, backend, device, threads, attention (and the batch and
    context of a curve key, where it has them)."""
    parts = [
        key["model"],
        key["dtype"],
        key["backend"],
        key["device"],
        f"t{key['threads']}",
        key["attention"],
    ]
    parts += [f"{p[0]}{key[p]}" for p in ("batch", "context") if p in key]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(x) for x in parts)) + ".json"


def finite_seconds(seconds: object) -> bool:
    """Whether ``seconds`` is a finite number above 0 (not a bool): a timing a cache may hold."""
    return (
        isinstance(seconds, int | float)
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and seconds > 0
    )


def curve_problem(sizes: object, seconds: object) -> str | None:
    """Why cached points cannot be used (a hand-edited or damaged file), or None: sizes must be
    positive integers, strictly increasing, and seconds as many finite positive numbers, never
    falling as tokens grow."""
    if (
        not isinstance(sizes, list)
        or not isinstance(seconds, list)
        or not sizes
        or len(sizes) != len(seconds)
    ):
        return "sizes and seconds are not two lists of one length"
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        return "a size is not a positive integer"
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        return "sizes do not increase"
    if not all(finite_seconds(t) for t in seconds):
        return "seconds are not all finite and positive"
    if any(b < a for a, b in zip(seconds, seconds[1:])):
        return "seconds fall as tokens grow"
    return None


def model_problem(data: dict) -> str | None:
    """Why a cached :class:`CostModel` record cannot be used, or None."""
    why = curve_problem(data.get("sizes"), data.get("seconds"))
    if why is None and data.get("long_sizes"):
        why = curve_problem(data.get("long_sizes"), data.get("long_seconds"))
    contexts = (data.get("context"), data.get("long_context"))
    if why is None and not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in contexts):
        why = "its contexts are not whole numbers of tokens"
    return why


def key_difference(found: object, key: dict) -> str:
    """What differs between a cached record's key and this set-up's, in a few words."""
    if not isinstance(found, dict):
        return "it has no key"
    diff = [k for k in key if found.get(k) != key[k]]
    shown = ", ".join(f"{k} {found.get(k)!r}, not {key[k]!r}" for k in diff[:2])
    return f"it was measured for another set-up ({shown})" if diff else "its key has unknown fields"


def read_record(f: Path, key: dict, problem: Callable[[dict], str | None], what: str) -> dict | None:
    """The record cached in ``f`` for ``key``, or None. No file: None, quietly. A file that is
    unreadable, not a JSON object, keyed for another set-up, or whose numbers ``problem``
    refuses: one line on stderr naming the file and why (it is measured again), then None."""
    if not f.exists():
        return None
    try:
        data = json.loads(f.read_text())
        why = None if isinstance(data, dict) else "it is not a JSON object"
    except (OSError, ValueError) as e:
        data, why = None, f"it cannot be read ({getattr(e, 'strerror', None) or type(e).__name__})"
    if why is None and data.get("key") != key:
        why = key_difference(data.get("key"), key)
    if why is None:
        why = problem(data)
    if why is not None:
        print(f"note: the {what} {f} is unusable ({why}); measuring it again", file=sys.stderr)
        return None
    return data


def write_record(folder: Path, f: Path, record: dict, what: str) -> None:
    """Write ``record`` to ``f`` atomically; a folder that cannot be written is said on stderr."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(record, indent=1)
        atomic_write(f, lambda tmp: tmp.write_text(text))
    except OSError as e:
        print(
            f"note: the {what} cannot be cached in {folder} ({e.strerror or e}), so it is measured "
            "again on every run; set decode.cost_cache=DIR to a writable folder",
            file=sys.stderr,
        )


WHAT = "verify-cost curve"


def cached_model(target, backend: str, cache_dir: str | Path | None = None) -> CostModel:
    """This set-up's :class:`CostModel`: from the cache when sound, else measured now (announced
    on stderr with its duration) and written for next time."""
    key = model_key(target, backend)
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    f = folder / cache_file_name(key)
    data = read_record(f, key, model_problem, WHAT)
    if data is not None:
        fields = ("sizes", "seconds", "context", "long_sizes", "long_seconds", "long_context")
        return CostModel(**{k: data[k] for k in fields if k in data}, key=data["key"])
    print(
        f"measuring the verify cost of this machine once ({backend}, up to {model_forwards()} target "
        "forwards), before any timing ...",
        end="",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    model = measure_model(target, backend)
    print(f" done in {time.perf_counter() - t0:.1f} s; cached in {folder}", file=sys.stderr, flush=True)
    write_record(folder, f, asdict(model), WHAT)
    return model


def cached_curve(
    target, backend: str, cache_dir: str | Path | None = None, batch: int = 1, context: int = CONTEXT_BUCKET
) -> CostCurve:
    """The verify-cost curve of ``batch`` rows after ``context`` cached tokens, read from this
    set-up's cached model (:func:`cached_model`)."""
    return cached_model(target, backend, cache_dir).curve(batch, context)
