"""Sections ``speed`` and ``compiled generate``: tokens/s against the baselines a user would try.

At batch 1: stock ``generate``, the decoder's graph-replayed one-token loop (no drafts), and
speculative decoding with the oracle at rate 0.8, eager and on the graphs backend, each after
``capture``; then ``generate`` on a static cache with the forward compiled, as transformers
documents it (CUDA only). Each speculative rate is reported against stock ``generate`` and
against the fastest plain baseline, the figure that says whether drafting pays.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from .decoder import backends_for, decoder
from .log import say
from .models import references
from .oracle import DEPTH, OneToken, Oracle
from .timing import timed_tokens_per_s

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@torch.no_grad()
def speed(target: PreTrainedModel, device: torch.device, prompt: torch.Tensor, new: int) -> dict:
    """Tokens/s (batch 1) of plain and speculative decoding; the oracle drafts at rate 0.8."""
    ids = prompt[None].to(device)
    refs, _ = references(target, prompt[None], new + DEPTH + 1)
    V = target.config.vocab_size
    graphs = backends_for(device)[1]
    rates: dict[str, float] = {}
    steps: dict[str, float] = {}

    def gen_stock() -> None:
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)

    rates["generate (stock)"] = timed_tokens_per_s(gen_stock, device, new)
    one = decoder(target, graphs, OneToken)
    capture_s = one.capture(batch=1, context=ids.shape[1] + new)
    say(f"  capture before timing, every verify bucket largest first ({graphs}): {capture_s:.2f} s")
    rates[f"one-token loop ({graphs})"] = timed_tokens_per_s(
        lambda: one.generate(ids, max_new_tokens=new), device, new
    )
    for backend in ("eager", graphs):
        oracle = Oracle(refs, 0.8, DEPTH, V, new)
        gen = decoder(target, backend, lambda o=oracle: o)
        gen.capture(batch=1, context=ids.shape[1] + new)  # the one-token loop's graphs serve it too
        rates[f"speculative {backend}, oracle 0.8"] = timed_tokens_per_s(
            lambda g=gen: g.generate(ids, max_new_tokens=new), device, new
        )
        st = gen.last_stats
        steps[backend] = 1000 * (st.total_time_s - st.prefill_time_s) / max(len(st.tree_tokens), 1)
        say(
            f"  speculative {backend}: tau {st.tau:.2f}, {steps[backend]:.2f} ms per step (tree {1 + 2 * DEPTH})"
        )
    report_rates(rates)
    return {"rates": rates, "step_ms": steps}


def report_rates(rates: dict[str, float]) -> None:
    """Tokens/s, and each speculative rate against stock generate and the fastest plain baseline."""
    plain = {k: v for k, v in rates.items() if not k.startswith("speculative")}
    fastest = max(plain, key=plain.get)
    stock = rates["generate (stock)"]
    say(f"  {'':<46} tokens/s   x generate   x fastest plain ({fastest})")
    for name, r in rates.items():
        say(f"  {name:<46} {r:8.1f}   {r / stock:9.2f}   {r / plain[fastest]:9.2f}")


@torch.no_grad()
def compiled_generate(
    target: PreTrainedModel, device: torch.device, prompt: torch.Tensor, new: int, found: dict
) -> None:
    """``generate`` on a static cache with the forward compiled, as transformers documents it."""
    if device.type != "cuda":
        say("  skipped off CUDA (inductor's CPU compile takes minutes on a small machine)")
        return
    ids = prompt[None].to(device)
    target.generation_config.cache_implementation = "static"
    target.forward = torch.compile(target.forward, mode="reduce-overhead", fullgraph=True)
    try:
        t0 = time.perf_counter()
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        target.generate(ids, **kw)
        say(f"  first call (compiles): {time.perf_counter() - t0:.1f} s")
        rate = timed_tokens_per_s(lambda: target.generate(ids, **kw), device, new)
    finally:
        del target.forward
        target.generation_config.cache_implementation = None
        torch._dynamo.reset()
    if found:
        found["rates"]["generate (static cache, compiled)"] = rate
        report_rates(found["rates"])
