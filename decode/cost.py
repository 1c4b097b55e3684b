"""What a target forward costs: the verify-cost curve, and the model it is read from.

The verify-cost curve ``c(n)``: seconds for one target forward that reads ``n`` new tokens
(over all rows of a batch) after a cached context, under a 4-D tree mask, followed by the argmax
of its logits (greedy's acceptance rule), on this device, model, dtype, backend and attention
implementation. The planner (:mod:`draftheads.decode.planner`) reads one per call.

No call measures: the curve of any batch and context comes from a :class:`CostModel` measured
once per set-up, before any timed work (:mod:`draftheads.decode.cost_cache` caches it). The
model is a few points at batch 1: every size at a short context ``c0`` and three sizes at a long
one ``c1``. A forward's cost is its linear layers, a function of the tokens it reads, plus
attention over the cache, linear in the cached tokens for every row (reading its keys and
values) and for every new token (its scores)::

    c(B, n, ctx) = f(B n) + (ctx - c0) (a B + b B n)

``f``: the short context's curve (linear between sizes); ``a`` and ``b``: a least-squares line
through the long context's extra seconds over ``f``, per cached token, against the tokens read.
The planner's online correction (its ``scale``) takes up what the model misses.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftheads.decode import backend as backends
from draftheads.decode.context import position_limit
from draftheads.decode.kv import new_cache
from draftheads.heads.masks import additive_mask

CURVE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CURVE_VERSION = 3  # 3: grouped-query attention folded under masks (decode/attention.py)
MODEL_VERSION = 2  # 2: the same
MODEL_SIZES = (1, 2, 4, 8, 16, 32, 64)  # tokens per forward at the short context
LONG_SIZES = (1, 8, 32)  # tokens per forward at the long context: enough for a and b
MODEL_CONTEXTS = (128, 1024)  # c0 and c1 (fewer where the model's positions end)
REPEATS = 3  # timed forwards per point, after one that pays one-off costs
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


def model_key(target, backend: str) -> dict:
    """Everything a :class:`CostModel` depends on: :func:`curve_key` less batch and context."""
    key = curve_key(target, backend)
    del key["batch"], key["context"]
    return {**key, "version": MODEL_VERSION}


@torch.no_grad()
def measure_points(
    target, backend: str, sizes: tuple[int, ...], context: int, repeats: int = REPEATS, batch: int = 1
) -> list[float]:
    """Median seconds of a target forward over ``n`` new tokens per row of ``batch`` rows after
    ``context`` cached tokens, then the argmax of its logits, for each ``n`` in ``sizes``."""
    p = next(target.parameters())
    dev, dtype = p.device, p.dtype
    vocab = int(target.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, context), generator=gen).to(dev)
    out = []
    with backends.applied(backend, target):
        cache = new_cache(target, keep=max(sizes))
        target(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
        for n in sizes:
            new = torch.randint(0, vocab, (batch, n), generator=gen).to(dev)
            allowed = torch.ones(n, context + n, dtype=torch.bool, device=dev).tril(context)
            mask = additive_mask(allowed[None].expand(batch, -1, -1), dtype)
            pos = torch.arange(context, context + n, device=dev)[None].expand(batch, -1)
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
    return out


def fitting(sizes: tuple[int, ...], context: int, limit: int | None) -> tuple[tuple[int, ...], int]:
    """``sizes`` and ``context`` cut to a model's ``limit`` positions (None: no limit)."""
    if limit is None:
        return sizes, context
    sizes = tuple(n for n in sizes if n < limit) or (1,)
    return sizes, max(1, min(context, limit - max(sizes)))


def measure_curve(
    target,
    backend: str,
    sizes: tuple[int, ...] = CURVE_SIZES,
    context: int = CONTEXT_BUCKET,
    repeats: int = 5,
    batch: int = 1,
) -> CostCurve:
    """The curve measured directly at ``batch`` rows after the context's bucket of cached tokens
    (fewer where the model's positions end); ``sizes`` are tokens per row, the curve's sizes all
    rows' tokens. The decoder reads :class:`CostModel` instead; this is the model's yardstick."""
    sizes, ctx = fitting(sizes, context_bucket(context), position_limit(target.config))
    out = measure_points(target, backend, sizes, ctx, repeats, batch)
    return CostCurve([batch * n for n in sizes], out, curve_key(target, backend, batch, context))


@dataclass
class CostModel:
    """Measured points behind ``c(B, n, ctx)`` (module docstring): ``seconds[i]`` one forward over
    ``sizes[i]`` tokens after ``context`` cached ones, ``long_seconds[i]`` over ``long_sizes[i]``
    after ``long_context`` (no long points where the model's positions end too soon)."""

    sizes: list[int]
    seconds: list[float]
    context: int
    long_sizes: list[int] = field(default_factory=list)
    long_seconds: list[float] = field(default_factory=list)
    long_context: int = 0
    key: dict = field(default_factory=dict)

    def slopes(self) -> tuple[float, float]:
        """``(a, b)``: seconds per cached token for each row and for each new token, from the
        least-squares line ``extra(n) / (c1 - c0) = a + b n`` (each clamped at 0)."""
        span = self.long_context - self.context
        if span <= 0 or not self.long_sizes:
            return 0.0, 0.0
        f = CostCurve(self.sizes, self.seconds)
        xs = [float(n) for n in self.long_sizes]
        ys = [(t - f(n)) / span for n, t in zip(self.long_sizes, self.long_seconds)]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var) if var > 0 else 0.0
        return max(0.0, my - b * mx), b

    def curve(self, batch: int, context: int) -> CostCurve:
        """``c(B, n, ctx)`` at ``B = batch`` and ``ctx = context`` for the model's sizes of ``n``,
        as the curve of all rows' tokens; never below half the short context's cost (a context
        shorter than ``c0`` saves attention, not the linear layers)."""
        a, b = self.slopes()
        f = CostCurve(self.sizes, self.seconds)
        extra = context - self.context
        sizes = [batch * n for n in self.sizes]
        seconds = [max(f(N) + extra * (a * batch + b * N), 0.5 * f(N)) for N in sizes]
        return CostCurve(sizes, rising(seconds), {**self.key, "batch": batch, "context": context})


def rising(seconds: list[float]) -> list[float]:
    """Each value at least those before it: a forward over more tokens does not cost less, so a
    dip is measurement noise."""
    out, top = [], 0.0
    for t in seconds:
        top = max(top, t)
        out.append(top)
    return out


def measure_model(target, backend: str, repeats: int = REPEATS) -> CostModel:
    """The model's points on this set-up: :data:`MODEL_SIZES` at ``c0``, :data:`LONG_SIZES` at
    ``c1`` (:data:`MODEL_CONTEXTS`, fewer where the model's positions end)."""
    limit = position_limit(target.config)
    c0, c1 = MODEL_CONTEXTS
    sizes, c0 = fitting(MODEL_SIZES, c0, limit)
    model = CostModel(list(sizes), rising(measure_points(target, backend, sizes, c0, repeats)), c0)
    long_sizes, c1 = fitting(tuple(n for n in LONG_SIZES if n in sizes), c1, limit)
    if c1 >= 2 * c0:  # a context span worth fitting a slope on
        model.long_sizes = list(long_sizes)
        model.long_seconds = rising(measure_points(target, backend, long_sizes, c1, repeats))
        model.long_context = c1
    model.key = model_key(target, backend)
    return model


def model_forwards() -> int:
    """How many target forwards :func:`measure_model` runs at most (for its announcement)."""
    return (len(MODEL_SIZES) + len(LONG_SIZES)) * (REPEATS + 1) + 2


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
