"""What a step costs, and how many drafted tokens are worth verifying.

The verify-cost curve ``c(n)``: seconds for one target forward that reads ``n`` new tokens
(over all rows of a batch) after a cached context, under a 4-D tree mask, followed by the argmax
of its logits (greedy's acceptance rule), on this device, model, dtype, backend and attention
implementation, for a batch size and a context-length bucket. It is measured once and cached as
JSON keyed by all of those (the file name carries the device and thread count too, so two
set-ups never overwrite each other); a cache written for anything else is measured again.

A step with a tree whose node i (root excluded) is accepted with probability p_i yields, in
expectation, ``E = 1 + Σ p_i`` tokens per row (the bonus token included) and costs
``d + c(B * T)`` seconds (drafting, then verifying T nodes for each of B rows). The planner
keeps, per step, the number of nodes n that maximises expected tokens per second::

    n* = argmax_n  Σ_b (1 + Σ_{i<=n} p_b,(i)) / (d + c(B (n + 1)))

(p_b,(i): row b's i-th best node score; a NaN score counts as 0). n = 0 verifies the root
alone: a plain decoding step.

How deep an EAGLE-2 tree is drafted is decided one step late, so that drafting never waits on a
host read: a further draft pass pays for itself when, even if every frontier node's children
were accepted (their total probability is at most the frontier's), the step's rate would beat
the best rate available without it. Once a step has read its tree's scores (with every
candidate's and each level's frontier in the same transfer), that test is applied to each level
in turn, and the next step drafts up to the first level that did not pay, or one level more
than this step did when all paid (up to ``decode.depth``), so a tree grows back as scores rise.

Whether to draft at all is judged on what drafted steps really gave, not on the scores:
``edge`` is a running mean of a drafted step's measured rate, ``(B + accepted drafts) /
(drafting + verify forward)``, over a plain step's ``B / c(B)``. When a drafted step keeps no
node, or ``edge`` is not above 1, the planner skips the drafter for ``wait`` steps (plain steps,
or lookup branches alone), then re-probes: it drafts one step and verifies at least one node,
so fresh acceptance reaches ``edge`` and ``trust`` even when the scores say nothing pays.
``wait`` doubles (up to :data:`MAX_WAIT`) while probes keep failing and is back at 1 once
drafting pays.

Measured time corrects the curve as decoding goes: ``scale`` follows the ratio of the measured
verify forward to the curve's prediction, and the draft pass cost is a running mean. Measured
acceptance corrects the scores: the expected number of accepted drafts of a verified tree is
Σ p_i over its nodes, and ``trust`` follows the ratio of accepted drafts to that sum (a drafter
that is over-confident gets its scores scaled down, an under-confident one up, capped at 1).
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
from collections.abc import Iterable
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
MAX_WAIT = 32  # the most steps the planner goes without drafting before it probes again


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


def next_depth(paid: Iterable[bool], depth: int, cap: int) -> int:
    """The levels to draft next step; ``paid`` says, for i = 0, 1, ..., whether level ``i + 2``
    paid for its draft pass given levels ``1..i + 1`` (judged after a step that drafted ``depth``).

    Up to the first level that did not pay; when every level judged paid, one level more than
    ``depth``, at most ``cap``, so the tree grows back when it can.
    """
    missed = next((i for i, p in enumerate(paid) if not p), None)
    return missed + 1 if missed is not None else min(depth + 1, cap)


def _probabilities(scores: torch.Tensor, trust: float) -> torch.Tensor:
    """Node scores as acceptance probabilities: scaled by ``trust``, in [0, 1], NaN as 0."""
    return torch.nan_to_num(scores.float(), nan=0.0).mul(trust).clamp(0.0, 1.0)


class Planner:
    """Per-step choices from the cost curve, corrected by what the steps really cost."""

    def __init__(self, curve: CostCurve, batch: int) -> None:
        self.curve, self.batch = curve, batch
        self.scale = 1.0  # observed / predicted verify time
        self.pass_s = curve(1) * 0.1  # one draft pass, until measured
        self.draft_s = 0.0  # this step's drafting so far
        self.trust = 1.0  # observed / predicted accepted drafts
        self.accepted, self.predicted = 2.0, 2.0  # running sums behind ``trust`` (a mild prior)
        self.edge = 1.0  # running mean of a drafted step's measured rate over a plain step's
        self.wait = 1  # steps to skip the drafter the next time drafting does not pay
        self.skip = 0  # steps still to skip
        self.probe = False  # the next drafted step follows a skip: verify something
        self.chosen: int | None = None  # nodes chosen for this step's tree, when it was drafted
        self.depth: int | None = None  # levels an EAGLE-2 tree drafts next (None: its cap)
        self.step_s = 0.0  # this step's drafting and verify forward, measured

    def verify_s(self, tokens: int) -> float:
        return self.scale * self.curve(tokens)

    def best(
        self, scores: torch.Tensor, valid: torch.Tensor | None = None, draft_s: float | None = None
    ) -> tuple[int, float, float]:
        """``(n, expected tokens, seconds)`` of the best number of nodes per row (root excluded)
        for node scores ``[B, N]`` (root excluded), with ``draft_s`` of drafting (default: this
        step's)."""
        draft_s = self.draft_s if draft_s is None else draft_s
        s = _probabilities(scores, self.trust)
        s = s if valid is None else torch.where(valid, s, 0.0)
        B, N = s.shape
        gain = s.sort(dim=-1, descending=True).values.cumsum(-1).sum(0).tolist()  # Σ_b Σ_{i<=n}
        best = (0, float(B), draft_s + self.verify_s(B))
        for n in range(1, N + 1):
            e, t = B + gain[n - 1], draft_s + self.verify_s(B * (n + 1))
            if e / t > best[1] / best[2]:
                best = (n, e, t)
        return best

    def drafting(self) -> bool:
        """Whether to run the drafter this step (False while drafting does not pay, between probes)."""
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def choose(self, scores: torch.Tensor, valid: torch.Tensor | None = None, drafted: bool = True) -> int:
        """How many nodes per row to verify this step (:meth:`best`); a probe (the first drafted
        step after a skip) verifies at least one. ``drafted``: the drafter ran for this tree."""
        n, _, _ = self.best(scores, valid)
        if drafted:
            self.chosen = n
            n, self.probe = (max(n, 1) if self.probe else n), False
        return n

    def expand(self, scores: torch.Tensor, frontier: torch.Tensor, passes: int) -> bool:
        """Whether one more draft pass over ``frontier [B, k]`` can raise the expected rate, after
        ``passes`` passes drafted the nodes scored ``scores [B, N]``."""
        n, e, t = self.best(scores, draft_s=passes * self.pass_s)
        k = frontier.shape[1]
        optimistic = e + float(_probabilities(frontier, self.trust).sum())
        cost = t + self.pass_s + self.verify_s(self.batch * (n + 1 + k)) - self.verify_s(self.batch * (n + 1))
        return optimistic / cost > e / t

    def replan(self, scores: torch.Tensor, frontiers: torch.Tensor, counts: list[int], cap: int) -> int:
        """Set (and return) the next step's depth from this step's expansion, on the host:
        ``scores [B, C]`` every candidate's path probability, ``counts[d - 1]`` those of levels
        1..d, ``frontiers [B, D, k]`` each level's frontier (``D = len(counts)`` levels drafted).

        Level d + 1 paid when :meth:`expand` says so given levels 1..d (d passes), judged for
        every level drafted after the first and for the one after the last, below ``cap``.
        """
        drafted = len(counts)
        paid = (  # lazily: judging stops at the first level that did not pay
            self.expand(scores[:, : counts[d - 1]], frontiers[:, d - 1], d)
            for d in range(1, min(drafted, cap - 1) + 1)
        )
        self.depth = next_depth(paid, drafted, cap)
        return self.depth

    def calibrate(self, predicted: float, accepted: float) -> None:
        """Fold one step's predicted (Σ p of verified nodes) and accepted drafts into ``trust``;
        after a drafted step, its measured rate into ``edge``, and decide whether to skip."""
        self.predicted = 0.95 * self.predicted + predicted
        self.accepted = 0.95 * self.accepted + accepted
        self.trust = min(max(self.accepted / max(self.predicted, 1e-6), 0.1), 10.0)
        chosen, self.chosen = self.chosen, None
        if chosen is None:
            return
        plain = self.batch / self.verify_s(self.batch)
        self.edge = 0.7 * self.edge + 0.3 * (self.batch + accepted) / max(self.step_s, 1e-9) / plain
        if chosen > 0 and self.edge > 1.0:
            self.wait = 1
        else:
            self.skip, self.probe = self.wait, True
            self.wait = min(2 * self.wait, MAX_WAIT)

    def observe(self, draft_s: float, passes: int, verify_s: float, tokens: int) -> None:
        """Fold one step's measured times in (exponential moving averages): ``verify_s`` is the
        verify forward alone (with the acceptance rule), what the curve measures."""
        if passes > 0:
            self.pass_s = 0.8 * self.pass_s + 0.2 * (draft_s / passes)
        predicted = self.curve(tokens)
        if predicted > 0:
            self.scale = 0.9 * self.scale + 0.1 * min(max(verify_s / predicted, 0.25), 4.0)
        self.step_s, self.draft_s = draft_s + verify_s, 0.0
