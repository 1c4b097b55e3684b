"""What a step costs, and how many drafted tokens are worth verifying.

The verify-cost curve ``c(n)``: seconds for one target forward that reads ``n`` new tokens
(over all rows of a batch) after a cached context, under a 4-D tree mask, on this device,
model, dtype and backend. It is measured once and cached as JSON keyed by all of those; a
cache written for anything else is ignored and measured again.

A step with a tree whose node i (root excluded) is accepted with probability p_i yields, in
expectation, ``E = 1 + Σ p_i`` tokens per row (the bonus token included) and costs
``d + c(B * T)`` seconds (drafting, then verifying T nodes for each of B rows). The planner
keeps, per step, the number of nodes n that maximises expected tokens per second::

    n* = argmax_n  Σ_b (1 + Σ_{i<=n} p_b,(i)) / (d + c(B (n + 1)))

(p_b,(i): row b's i-th best node score). n = 0 verifies the root alone: a plain decoding step.
Before each further draft pass it asks whether that pass can pay for itself: even if every
frontier node's children were accepted (their total probability is at most the frontier's),
would the step's rate beat the best rate available without it?

Measured time corrects the curve as decoding goes: ``scale`` follows the ratio of observed to
predicted verify time, and the draft pass cost is a running mean. Measured acceptance corrects
the scores: the expected number of accepted drafts of a verified tree is Σ p_i over its nodes,
and ``trust`` follows the ratio of accepted drafts to that sum (a drafter that is
over-confident gets its scores scaled down, an under-confident one up, capped at 1).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from draftheads.decode import backend as backends
from draftheads.heads.checkpoint import atomic_write
from draftheads.heads.masks import additive_mask

CURVE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CURVE_VERSION = 1


@dataclass
class CostCurve:
    """``seconds[i]``: one target forward over ``sizes[i]`` new tokens; ``key`` says for what."""

    sizes: list[int]
    seconds: list[float]
    key: dict = field(default_factory=dict)

    def __call__(self, n: int) -> float:
        """c(n), linear between measured sizes and beyond the last one."""
        s, t = self.sizes, self.seconds
        if n <= s[0]:
            return t[0] * n / s[0] if n < s[0] else t[0]
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


def curve_key(target, backend: str) -> dict:
    """Everything the curve depends on: device, threads, torch, model shape and dtype, backend."""
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
    }


@torch.no_grad()
def measure_curve(
    target, backend: str, sizes: tuple[int, ...] = CURVE_SIZES, context: int = 128, repeats: int = 5
) -> CostCurve:
    """Median seconds of a target forward over n new tokens after ``context`` cached tokens."""
    from transformers import DynamicCache

    p = next(target.parameters())
    dev, dtype = p.device, p.dtype
    vocab = int(target.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=gen).to(dev)
    out = []
    with backends.applied(backend, target):
        for n in sizes:
            times = []
            for _ in range(repeats + 1):
                cache = DynamicCache()
                target(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
                new = torch.randint(0, vocab, (1, n), generator=gen).to(dev)
                allowed = torch.ones(n, context + n, dtype=torch.bool, device=dev).tril(context)
                mask = additive_mask(allowed[None], dtype)
                pos = torch.arange(context, context + n, device=dev)[None]
                _sync(dev)
                t0 = time.perf_counter()
                target(
                    input_ids=new,
                    attention_mask=mask,
                    position_ids=pos,
                    cache=cache,
                    use_cache=True,
                    output_hidden_states=True,
                )
                _sync(dev)
                times.append(time.perf_counter() - t0)
            out.append(statistics.median(times[1:]))  # the first call pays one-off costs
    return CostCurve(list(sizes), out, curve_key(target, backend))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def default_cache_dir() -> Path:
    """``$DRAFTHEADS_COST_CACHE``, else ``$XDG_CACHE_HOME/draftheads/cost``."""
    if os.environ.get("DRAFTHEADS_COST_CACHE"):
        return Path(os.environ["DRAFTHEADS_COST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "draftheads" / "cost"


def cached_curve(target, backend: str, cache_dir: str | Path | None = None) -> CostCurve:
    """The curve for this device, model and backend: from the cache when its key matches
    exactly, else measured now and written (atomically) for next time."""
    key = curve_key(target, backend)
    name = "-".join(str(key[k]) for k in ("model", "dtype", "backend")).replace("/", "_")
    path = Path(cache_dir) if cache_dir else default_cache_dir()
    f = path / f"{name}.json"
    try:
        data = json.loads(f.read_text())
        if data.get("key") == key:
            return CostCurve(data["sizes"], data["seconds"], data["key"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    curve = measure_curve(target, backend)
    try:
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(f, lambda tmp: tmp.write_text(json.dumps(asdict(curve), indent=1)))
    except OSError:
        pass  # an unwritable cache only costs a measurement next time
    return curve


class Planner:
    """Per-step choices from the cost curve, corrected by what the steps really cost."""

    def __init__(self, curve: CostCurve, batch: int) -> None:
        self.curve, self.batch = curve, batch
        self.scale = 1.0  # observed / predicted verify time
        self.pass_s = curve(1) * 0.1  # one draft pass, until measured
        self.draft_s = 0.0  # this step's drafting so far
        self.trust = 1.0  # observed / predicted accepted drafts
        self.accepted, self.predicted = 2.0, 2.0  # running sums behind ``trust`` (a mild prior)

    def verify_s(self, tokens: int) -> float:
        return self.scale * self.curve(tokens)

    def best(self, scores: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[int, float, float]:
        """``(n, expected tokens, seconds)`` of the best number of nodes per row (root excluded)
        for node scores ``[B, N]`` (root excluded), with this step's drafting cost."""
        s = (scores.float() * self.trust).clamp(max=1.0)
        s = s if valid is None else torch.where(valid, s, 0.0)
        B, N = s.shape
        gain = s.sort(dim=-1, descending=True).values.cumsum(-1).sum(0).tolist()  # Σ_b Σ_{i<=n}
        best = (0, float(B), self.draft_s + self.verify_s(B))
        for n in range(1, N + 1):
            e, t = B + gain[n - 1], self.draft_s + self.verify_s(B * (n + 1))
            if e / t > best[1] / best[2]:
                best = (n, e, t)
        return best

    def expand(self, scores: torch.Tensor, frontier: torch.Tensor, passes: int) -> bool:
        """Whether one more draft pass over ``frontier [B, k]`` can raise the expected rate."""
        self.draft_s = passes * self.pass_s
        n, e, t = self.best(scores)
        k = frontier.shape[1]
        optimistic = e + float((frontier.float() * self.trust).clamp(max=1.0).sum())
        cost = t + self.pass_s + self.verify_s(self.batch * (n + 1 + k)) - self.verify_s(self.batch * (n + 1))
        return optimistic / cost > e / t

    def calibrate(self, predicted: float, accepted: float) -> None:
        """Fold one step's predicted (Σ p of verified nodes) and accepted drafts into ``trust``."""
        self.predicted = 0.95 * self.predicted + predicted
        self.accepted = 0.95 * self.accepted + accepted
        self.trust = min(max(self.accepted / max(self.predicted, 1e-6), 0.1), 10.0)

    def observe(self, draft_s: float, passes: int, verify_s: float, tokens: int) -> None:
        """Fold one step's measured times in (exponential moving averages)."""
        if passes > 0:
            self.pass_s = 0.8 * self.pass_s + 0.2 * (draft_s / passes)
        predicted = self.curve(tokens)
        if predicted > 0:
            self.scale = 0.9 * self.scale + 0.1 * min(max(verify_s / predicted, 0.25), 4.0)
        self.draft_s = 0.0
