"""``decode.backend=auto`` by measurement: the backend that is fastest here, for the target and the drafter.

Which kernel wins is a property of the machine, not of the code: pre-packed oneDNN weights beat
stock PyTorch's ``linear`` on one CPU and lose to it on the next. So on first use on a device
``auto`` times each candidate backend on the models' own shapes and keeps the fastest:

* the target: the median of a few 1-token forwards (and the argmax of their logits) after a short
  cached context, what a plain decoding step costs;
* the drafter: the median of a few calls of its own linear layers (those it does not share with
  the target) on a drafting step's rows, the only part of drafting a backend changes.

The timings are cached as JSON beside the cost curves (same folder), one file per part, device,
thread count, dtype and model shapes; a file whose key differs in anything (another device,
thread count, torch or shape), or whose timings are not finite and positive, is said in one line
and measured again, never reused (the same validation as the cost model's). A backend named explicitly is
used as asked; when another candidate was measured faster the decoder says by how much.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from draftheads.decode import backend as backends
from draftheads.decode.context import position_limit
from draftheads.decode.cost import device_name
from draftheads.decode.cost_cache import default_cache_dir, finite_seconds, read_record, write_record
from draftheads.decode.kv import new_cache

CHOICE_VERSION = 2  # 2: grouped-query attention folded under masks (decode/attention.py)
STEPS = 5  # timed calls per candidate (after one untimed call that pays one-off costs)
CONTEXT = 32  # cached tokens before a timed target step
DRAFT_ROWS = 4  # rows of a timed drafter call: a drafting step's candidates
NOTABLE = 1.03  # an asked backend this much slower than the fastest is worth a line


@dataclass
class Choice:
    """The backend for one part (``target`` or ``drafter``) and every candidate's seconds a call."""

    part: str
    name: str
    seconds: dict[str, float]
    asked: bool = False  # named explicitly (used as asked), not chosen
    cached: bool = False

    @property
    def fastest(self) -> str:
        return min(self.seconds, key=self.seconds.get)

    def line(self) -> str:
        """One line: the backend, its timing, the alternatives'; for an asked backend measured
        slower than another, by how much; an asked one nothing timed, that."""
        if not self.seconds:
            return f"backend for the {self.part}: {self.name} (as asked; not timed)"
        ms = {n: f"{s * 1e3:.2f} ms" for n, s in self.seconds.items()}
        others = ", ".join(f"{n} {t}" for n, t in ms.items() if n != self.name)
        where = "cached" if self.cached else "measured"
        if self.asked and self.slowdown() >= NOTABLE:
            return (
                f"backend for the {self.part}: decode.backend={self.name} is {self.slowdown():.2f}x slower than "
                f"{self.fastest} here ({ms[self.name]} vs {ms[self.fastest]} a call, {where}); used as asked"
            )
        how = "as asked" if self.asked else "auto"
        return f"backend for the {self.part}: {self.name} ({how}, {ms[self.name]} a call; {others}; {where})"

    def slowdown(self) -> float:
        """This backend's seconds over the fastest candidate's."""
        return self.seconds[self.name] / max(self.seconds[self.fastest], 1e-12)


def candidates(device: torch.device, dtype: torch.dtype) -> tuple[str, ...]:
    """The backends worth timing against each other here: stock and oneDNN on a float32 CPU with
    oneDNN; none elsewhere (one backend applies, chosen by :func:`backend.resolve`)."""
    if device.type == "cpu" and dtype == torch.float32 and backends.onednn_available():
        return ("eager", "onednn")
    return ()


def own_layers(drafter_modules: list[nn.Module], target: nn.Module) -> list[nn.Linear]:
    """The drafter's CPU linear layers that are not the target's (a shared lm_head is the target's)."""
    shared = {id(m) for m in backends.linears(target)}
    return [m for m in backends.linears(*drafter_modules) if id(m) not in shared]


def target_shapes(target: nn.Module) -> dict:
    """What a target step's cost depends on besides the machine: architecture and sizes."""
    c = target.config
    names = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
    names += ("num_key_value_heads", "vocab_size")
    return {
        "architecture": (getattr(c, "architectures", None) or [type(target).__name__])[0],
        **{n: getattr(c, n, None) for n in names},
        "attention": getattr(c, "_attn_implementation", None) or "eager",
    }


def layer_shapes(layers: list[nn.Linear]) -> dict:
    return {"linears": [[m.in_features, m.out_features, m.bias is not None] for m in layers]}


def choice_key(part: str, device: torch.device, dtype: torch.dtype, shapes: dict) -> dict:
    """Everything a timing depends on: part, device, threads, torch, dtype and shapes."""
    return {
        "version": CHOICE_VERSION,
        "part": part,
        "device": f"{device.type}:{device_name(device)}",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dtype": str(dtype),
        "shapes": shapes,
    }


def cache_file(key: dict) -> str:
    """One file per part, device, thread count, dtype and shapes (a digest of the shapes)."""
    digest = hashlib.sha256(json.dumps(key["shapes"], sort_keys=True).encode()).hexdigest()[:12]
    parts = ["backend", key["part"], key["device"], f"t{key['threads']}", key["dtype"], digest]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts)) + ".json"


def _median_seconds(call: Callable[[], object], steps: int = STEPS) -> float:
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first call pays one-off costs


@torch.no_grad()
def time_target(target: nn.Module, name: str, cache: backends.PackCache | None = None) -> float:
    """Median seconds of a 1-token target forward and its argmax after ``CONTEXT`` cached tokens
    (fewer on a target with fewer positions: the step must stay inside its position table)."""
    p = next(target.parameters())
    gen = torch.Generator().manual_seed(0)
    vocab = int(target.config.vocab_size)
    context = min(CONTEXT, (position_limit(target.config) or CONTEXT + 1) - 1)
    prompt = torch.randint(0, vocab, (1, context), generator=gen).to(p.device)
    new = torch.randint(0, vocab, (1, 1), generator=gen).to(p.device)
    with backends.applied(name, target, cache=cache):
        kv = new_cache(target)
        target(input_ids=prompt, cache=kv, use_cache=True, logits_to_keep=1)

        def step() -> None:
            target(input_ids=new, cache=kv, use_cache=True).logits.argmax(-1)
            kv.crop(-1)  # back to the context alone

        return _median_seconds(step)


@torch.no_grad()
def time_layers(layers: list[nn.Linear], name: str, cache: backends.PackCache | None = None) -> float:
    """Median seconds of one call of every layer in ``layers`` on ``DRAFT_ROWS`` rows."""
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(DRAFT_ROWS, m.in_features, generator=gen).to(m.weight.device) for m in layers]
    with backends.applied(name, *layers, cache=cache):
        return _median_seconds(lambda: [m(x) for m, x in zip(layers, xs)])


def measured(
    key: dict,
    names: tuple[str, ...],
    timer: Callable[[str], float] | None,
    cache_dir: str | Path | None = None,
) -> tuple[dict[str, float], bool]:
    """``(seconds per candidate, whether they came from the cache)``: the cache file when it is
    sound for ``key`` and times every candidate (:func:`~draftheads.decode.cost_cache.read_record`:
    anything else is said in one line), else ``timer`` on each now, written for next time; with
    no ``timer``, nothing is timed (``{}`` where the cache has none)."""
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    f = folder / cache_file(key)

    def problem(data: dict) -> str | None:
        seconds = data.get("seconds")
        if not isinstance(seconds, dict) or not all(finite_seconds(seconds.get(n)) for n in names):
            return f"it does not time every one of {', '.join(names)} in finite positive seconds"
        return None

    data = read_record(f, key, problem, "backend timings")
    if data is not None:
        return {n: float(data["seconds"][n]) for n in names}, True
    if timer is None:
        return {}, False
    seconds = {n: timer(n) for n in names}
    write_record(folder, f, {"key": key, "seconds": seconds}, "backend timings")
    return seconds, False


def choose(
    part: str,
    asked: str,
    names: tuple[str, ...],
    key: dict,
    timer: Callable[[str], float],
    cache_dir: str | Path | None = None,
) -> Choice:
    """The backend for ``part``: ``asked`` when it is named (nothing is timed for it; timings an
    earlier choice cached tell what the choice costs), else the fastest of ``names``."""
    named = asked != "auto"
    seconds, cached = measured(key, names, None if named else timer, cache_dir)
    name = asked if named else min(seconds, key=seconds.get)
    return Choice(part, name, seconds, asked=named, cached=cached)


def choose_target(
    asked: str,
    target: nn.Module,
    cache_dir: str | Path | None = None,
    cache: backends.PackCache | None = None,
) -> Choice | None:
    """The target's measured backend choice, or None where there is nothing to choose between
    (one candidate, or a backend named that is not a candidate, such as ``cuda-graphs``)."""
    p = next(target.parameters())
    names = candidates(p.device, p.dtype)
    if not names or (asked != "auto" and asked not in names):
        return None
    key = choice_key("target", p.device, p.dtype, target_shapes(target))
    return choose("target", asked, names, key, lambda n: time_target(target, n, cache), cache_dir)


def choose_drafter(
    asked: str,
    layers: list[nn.Linear],
    cache_dir: str | Path | None = None,
    cache: backends.PackCache | None = None,
) -> Choice | None:
    """The backend for the drafter's own ``layers``, as :func:`choose_target`; None without any."""
    if not layers:
        return None
    w = layers[0].weight
    names = candidates(w.device, w.dtype)
    if not names or (asked != "auto" and asked not in names):
        return None
    key = choice_key("drafter", w.device, w.dtype, layer_shapes(layers))
    return choose("drafter", asked, names, key, lambda n: time_layers(layers, n, cache), cache_dir)


def pick(
    asked: str,
    resolved: str,
    target: nn.Module,
    drafter_layers: list[nn.Linear],
    cache_dir: str | Path | None = None,
    cache: backends.PackCache | None = None,
) -> tuple[str, str, list[Choice]]:
    """``(target's backend, drafter's backend, the choices timed)`` for ``decode.backend=asked``
    (``resolved``: what :func:`backend.resolve` made of it, kept where nothing is timed)."""
    if resolved == "cuda-graphs":
        return resolved, resolved, []
    t = choose_target(asked, target, cache_dir, cache)
    first = t.name if t is not None else resolved
    d = choose_drafter(asked, drafter_layers, cache_dir, cache)
    return first, d.name if d is not None else first, [c for c in (t, d) if c is not None]


def run_backend(gen, drafter_modules: list[nn.Module]) -> backends.Backend:
    """A generator's per-call backend: the target's layers (with those the drafter shares) packed
    when ``gen.backend`` is ``onednn``, the drafter's own when ``gen.drafter_backend`` is."""
    if gen.backend == gen.drafter_backend:
        return backends.Backend(gen.backend, gen.target, *drafter_modules, cache=gen.packs)
    packed: list[nn.Module] = []
    if gen.backend == "onednn":
        packed += backends.linears(gen.target)
    if gen.drafter_backend == "onednn":
        packed += gen.drafter_layers
    return backends.Backend("onednn", *packed, cache=gen.packs)


def as_record(choice: Choice | None) -> dict | None:
    """A choice as a report's JSON (None stays None)."""
    return None if choice is None else asdict(choice)
