"""What a step costs, and how many drafted tokens are worth verifying.

The verify-cost curve ``c(n)``: seconds for one target forward that reads ``n`` new tokens
(over all rows of a batch) after a cached context, under a 4-D tree mask, followed by the argmax
of its logits (greedy's acceptance rule), on this device, model, dtype, backend and attention
implementation, for a batch size and a context-length bucket. It is measured once and cached as
JSON keyed by all of those (the file name carries the device and thread count too, so two
set-ups never overwrite each other); a cache written for anything else is measured again.

The planner that reads it is :mod:`draftheads.decode.planner`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from draftheads.decode import backend as backends
from draftheads.decode.context import position_limit
from draftheads.heads.checkpoint import atomic_write
from draftheads.heads.masks import additive_mask

CURVE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CURVE_VERSION = 2
CONTEXT_BUCKET = 128  # context lengths are bucketed to 128, 256, 512, ... cached tokens


@dataclass
class CostCurve:
    """``seconds[i]``: one target forward over ``sizes[i]`` new tokens; ``key`` says for what."""

    sizes: list[int]
    seconds: list[float]
    key: dict = field(default_factory=dict)

    def __call__(self, n: int) -> float:
        """c(n), linear between measured sizes and beyond the last one; below the first size (a
        batch's curve once rows have finished) the first size's cost: a forward's fixed costs do
        not shrink with its rows."""
        s, t = self.sizes, self.seconds
        if n <= s[0]:
            return t[0]
        for i in range(1, len(s)):
            if n <= s[i]:
                w = (n - s[i - 1]) / (s[i] - s[i - 1])
                return t[i - 1] + w * (t[i] - t[i - 1])
        slope = (t[-1] - t[-2]) / (s[-1] - s[-2]) if len(s) > 1 else t[-1] / s[-1]
        return t[-1] + slope * (n - s[-1])

    def relative(self) -> dict[int, float]:
        """c(n) / c(1): a step's cost in plain decoding steps."""
        return {n: round(t / self.seconds[0], 3) for n, t in zip(self.sizes, self.seconds)}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def context_bucket(context: int) -> int:
    """The bucket of a context length: the least of 128, 256, 512, ... that holds it."""
    bucket = CONTEXT_BUCKET
    while bucket < context:
        bucket *= 2
    return bucket


def curve_key(target, backend: str, batch: int = 1, context: int = CONTEXT_BUCKET) -> dict:
    """Everything the curve depends on: device, threads, torch, model shape and dtype, backend,
    attention implementation, batch size and the context's bucket."""
    p = next(target.parameters())
    c = target.config
    return {
        "version": CURVE_VERSION,
        "device": f"{p.device.type}:{device_name(p.device)}",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": str(getattr(c, "_name_or_path", "") or c.model_type),
        "architecture": (getattr(c, "architectures", None) or [type(target).__name__])[0],
        "hidden_size": int(c.hidden_size),
        "num_layers": int(c.num_hidden_layers),
        "vocab_size": int(c.vocab_size),
        "dtype": str(p.dtype),
        "backend": backend,
        "attention": getattr(c, "_attn_implementation", None) or "eager",
        "batch": int(batch),
        "context": context_bucket(context),
    }


@torch.no_grad()
def measure_curve(
    target,
    backend: str,
    sizes: tuple[int, ...] = CURVE_SIZES,
    context: int = CONTEXT_BUCKET,
    repeats: int = 5,
    batch: int = 1,
) -> CostCurve:
    """Median seconds of a target forward over ``n`` new tokens per row of ``batch`` rows after
    the context's bucket of cached tokens (fewer where the model's positions end), then the
    argmax of its logits; ``sizes`` are tokens per row, the curve's sizes all rows' tokens."""
    from transformers import DynamicCache

    p = next(target.parameters())
    dev, dtype = p.device, p.dtype
    vocab = int(target.config.vocab_size)
    limit = position_limit(target.config)
    ctx = context_bucket(context)
    if limit is not None:
        sizes = tuple(n for n in sizes if n < limit) or (1,)
        ctx = max(1, min(ctx, limit - max(sizes)))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, ctx), generator=gen).to(dev)
    out = []
    with backends.applied(backend, target):
        cache = DynamicCache()
        target(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
        for n in sizes:
            new = torch.randint(0, vocab, (batch, n), generator=gen).to(dev)
            allowed = torch.ones(n, ctx + n, dtype=torch.bool, device=dev).tril(ctx)
            mask = additive_mask(allowed[None].expand(batch, -1, -1), dtype)
            pos = torch.arange(ctx, ctx + n, device=dev)[None].expand(batch, -1)
            times = []
            for _ in range(repeats + 1):
                _sync(dev)
                t0 = time.perf_counter()
                logits = target(
                    input_ids=new,
                    attention_mask=mask,
                    position_ids=pos,
                    cache=cache,
                    use_cache=True,
                    output_hidden_states=True,
                ).logits
                logits.argmax(-1)
                _sync(dev)
                times.append(time.perf_counter() - t0)
                cache.crop(-n)  # back to the context alone
            out.append(statistics.median(times[1:]))  # the first call pays one-off costs
    return CostCurve([batch * n for n in sizes], out, curve_key(target, backend, batch, context))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def default_cache_dir() -> Path:
    """``$DRAFTHEADS_COST_CACHE``, else ``$XDG_CACHE_HOME/draftheads/cost``."""
    if os.environ.get("DRAFTHEADS_COST_CACHE"):
        return Path(os.environ["DRAFTHEADS_COST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "draftheads" / "cost"


def cache_file_name(key: dict) -> str:
    """One file per set-up: model, dtype, backend, device, threads, attention, batch, context."""
    parts = [
        key["model"],
        key["dtype"],
        key["backend"],
        key["device"],
        f"t{key['threads']}",
        key["attention"],
        f"b{key['batch']}",
        f"c{key['context']}",
    ]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(x) for x in parts)) + ".json"


def curve_problem(sizes: object, seconds: object) -> str | None:
    """Why a cached curve cannot be used (a hand-edited or damaged file), or None: its sizes must
    be positive integers, strictly increasing, and its seconds as many finite positive numbers,
    never falling as tokens grow."""
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
    if any(
        isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0
        for t in seconds
    ):
        return "seconds are not all finite and positive"
    if any(b < a for a, b in zip(seconds, seconds[1:])):
        return "seconds fall as tokens grow"
    return None


def monotone(curve: CostCurve) -> CostCurve:
    """``curve`` with each size's seconds at least those of the sizes below it: a forward over
    more tokens does not cost less, so a dip is measurement noise (and the cached file passes
    :func:`curve_problem`)."""
    seconds, top = [], 0.0
    for t in curve.seconds:
        top = max(top, t)
        seconds.append(top)
    return CostCurve(list(curve.sizes), seconds, curve.key)


def read_cached(f: Path, key: dict) -> CostCurve | None:
    """The curve cached in ``f`` for ``key``, or None: no such file, another set-up's, or one that
    :func:`curve_problem` refuses (said on stderr, since it is measured again)."""
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    why = curve_problem(data.get("sizes"), data.get("seconds"))
    if why is not None:
        print(f"note: the verify-cost curve {f} is unusable ({why}); measuring it again", file=sys.stderr)
        return None
    return CostCurve(data["sizes"], [float(t) for t in data["seconds"]], data["key"])


def cached_curve(
    target, backend: str, cache_dir: str | Path | None = None, batch: int = 1, context: int = CONTEXT_BUCKET
) -> CostCurve:
    """The curve for this set-up, ``batch`` rows and the bucket of ``context``: from the cache when
    its key matches exactly and its values are sound (:func:`read_cached`), else measured now and
    written (atomically) for next time; a cache that cannot be written is said on stderr."""
    key = curve_key(target, backend, batch, context)
    path = Path(cache_dir) if cache_dir else default_cache_dir()
    f = path / cache_file_name(key)
    cached = read_cached(f, key)
    if cached is not None:
        return cached
    curve = monotone(measure_curve(target, backend, context=context, batch=batch))
    try:
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(f, lambda tmp: tmp.write_text(json.dumps(asdict(curve), indent=1)))
    except OSError as e:
        print(
            f"note: the verify-cost curve cannot be cached in {path} ({e.strerror or e}), so it is measured "
            "again on every run; set decode.cost_cache=DIR to a writable folder",
            file=sys.stderr,
        )
    return curve
