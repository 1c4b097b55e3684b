"""The evaluation loop: acceptance (τ) and wall-clock speedup on given prompts, with baselines.

Every prompt is chat-templated and every turn of a multi-turn prompt is decoded: the
conversation grows with the target's own answer to each turn. For each turn, in the same
run and back to back, we decode

* with the target's stock greedy ``generate`` (eager PyTorch: what a user has without us),
* with the same greedy ``generate`` on the decoder's backend (e.g. pre-packed oneDNN weights):
  the reference output,
* with the project's plain loop on that backend (:func:`draftheads.decode.batched.generate_retiring`):
  the faster of the two plain loops is the baseline for the decoding method itself
  (:mod:`draftheads.decode.baseline`),
* with each speculative generator (target + a drafter, on that backend): several drafters share
  one loop, so the greedy runs above are paid once per turn and every ratio comes from one run,
* with each requested baseline: transformers' prompt lookup decoding (``pld``) and, when
  ``eval.assistant_model`` is given, assisted generation (``assisted``).

τ is the mean number of tokens a target forward produces (bonus token included); for the
transformers baselines it is counted the same way, with a forward hook on the target.
The prompts are passed in; :mod:`draftheads.decode.report` turns the turns into numbers and
Markdown, :mod:`draftheads.decode.plots` into figures.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import backend as backends
from draftheads.decode.baseline import timed_retiring
from draftheads.decode.context import fit_new_tokens, position_limit
from draftheads.decode.prompting import encode_prompt


@dataclass
class TurnResult:
    """One decoded turn: the speculative run's counters next to each baseline's."""

    prompt_id: str
    category: str
    new_tokens: int
    spec_time_s: float
    base_time_s: float
    target_forwards: int
    accepted_lengths: list[int]
    identical: bool
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    backend: str = "eager"
    stock_time_s: float = 0.0  # the target's stock (eager) greedy generate
    identical_stock: bool = True  # the output also equals stock generate's
    retiring_time_s: float | None = None  # the plain retiring loop on the same backend (None: not run)
    tree_tokens: list[int] = field(default_factory=list)  # nodes verified per step
    # spec_time_s in parts (decode/stats.py), with ``outside``: the call's time outside its stream
    # (building generate's output); the parts add up to spec_time_s
    time_split: dict[str, float] = field(default_factory=dict)


class ForwardCounter:
    """Counts forward calls of a module (a forward hook), to measure τ of any decoding method."""

    def __init__(self, module: nn.Module) -> None:
        self.count = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def timed(fn, *args, **kwargs):
    """``(result, seconds)``; synchronises CUDA so that GPU time is counted."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def evaluate_prompts(
    target: nn.Module,
    tokenizer,
    generators: dict[str, Any],
    prompts: list,
    max_new_tokens: int,
    baselines: list[str],
    assistant: nn.Module | None = None,
    progress: bool = True,
) -> dict[str, list[TurnResult]]:
    """Decode every turn of every prompt with each generator and each baseline (greedy).

    Per turn: stock greedy once, greedy on each distinct backend once, then every generator,
    then the baselines once (their figures are attached to every generator's result). The
    conversation continues with the reference answer of the first generator's backend. Every
    method answers a turn with the same number of new tokens: ``max_new_tokens``, or the room
    the turn leaves in the target's context; a later turn that leaves none ends its
    conversation. Both are counted in one note at the end."""
    from tqdm import tqdm

    device = next(target.parameters()).device
    limit = position_limit(target.config)
    capped = ended = 0
    eos = tokenizer.eos_token_id
    gen_kw = dict(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    results: dict[str, list[TurnResult]] = {name: [] for name in generators}
    first_backend = next(iter(generators.values())).backend
    n_turns = sum(len(p.turns) for p in prompts)
    bar = tqdm(total=n_turns, desc="eval", unit="turn", disable=not progress)
    accepted = dict.fromkeys(generators, 0)
    forwards = dict.fromkeys(generators, 0)
    for p in prompts:
        messages: list[dict[str, str]] = []
        for turn in p.turns:
            messages.append({"role": "user", "content": turn})
            ids = encode_prompt(tokenizer, messages).to(device)
            n_prompt = ids.shape[1]
            if limit is not None and n_prompt >= limit:  # only a later turn: the first ones were checked
                ended += 1
                break
            new, note = fit_new_tokens(n_prompt, max_new_tokens, limit)
            capped += note is not None
            turn_kw = {**gen_kw, "max_new_tokens": new}
            mask = torch.ones_like(ids)
            stock, stock_s = timed(target.generate, ids, attention_mask=mask, **turn_kw)
            stock_new = _trim(stock[0, n_prompt:], tokenizer.pad_token_id, eos)
            refs: dict[str, tuple[torch.Tensor, float]] = {}  # backend -> (reference answer, seconds)
            plain: dict[str, float | None] = {}  # backend -> the retiring loop's seconds
            for gen in generators.values():
                if gen.backend not in refs:
                    with backends.applied(gen.backend, target, cache=gen.packs):
                        ref, base_s = timed(target.generate, ids, attention_mask=mask, **turn_kw)
                    refs[gen.backend] = (_trim(ref[0, n_prompt:], tokenizer.pad_token_id, eos), base_s)
                    run = timed_retiring(target, gen.backend, gen.packs, ids, mask, **turn_kw)
                    plain[gen.backend] = run.seconds if run is not None else None
            decoded = {}
            for name, gen in generators.items():
                out, spec_s = timed(gen.generate, ids, max_new_tokens=new, do_sample=False, eos_token_id=eos)
                decoded[name] = (
                    _trim(out[0, n_prompt:], tokenizer.pad_token_id, eos),
                    spec_s,
                    gen.last_stats,
                )
            extra = {name: _run_baseline(name, target, ids, turn_kw, assistant) for name in baselines}
            for name, gen in generators.items():
                out_new, spec_s, stats = decoded[name]
                ref_new, base_s = refs[gen.backend]
                results[name].append(
                    TurnResult(
                        prompt_id=str(p.id),
                        category=p.category or "all",
                        new_tokens=len(out_new),
                        spec_time_s=spec_s,
                        base_time_s=base_s,
                        target_forwards=stats.target_forwards,
                        accepted_lengths=list(stats.accepted_lengths),
                        identical=torch.equal(ref_new, out_new),
                        draft_time_s=stats.draft_time_s,
                        verify_time_s=stats.verify_time_s,
                        baselines=extra,
                        backend=gen.backend,
                        stock_time_s=stock_s,
                        identical_stock=torch.equal(stock_new, out_new),
                        retiring_time_s=plain[gen.backend],
                        tree_tokens=list(stats.tree_tokens),
                        time_split={**stats.split(), "outside": spec_s - stats.total_time_s},
                    )
                )
                accepted[name] += sum(stats.accepted_lengths)
                forwards[name] += len(stats.accepted_lengths)
            bar.set_postfix(tau=" ".join(f"{accepted[k] / max(forwards[k], 1):.2f}" for k in generators))
            bar.update(1)
            answer = tokenizer.decode(refs[first_backend][0], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
    bar.close()
    if capped or ended:
        print(
            f"eval: {capped} answers stopped at the target's context of {limit} tokens and {ended} "
            "conversations ended there (every method got the same room)",
            file=sys.stderr,
        )
    return results


def check_prompts_fit(tokenizer, prompts: list, limit: int | None) -> None:
    """Refuse, before any decoding, a prompt whose first turn leaves no room for an answer in the
    target's ``limit`` positions."""
    if limit is None:
        return
    for p in prompts:
        n = encode_prompt(tokenizer, p.turns[0]).shape[1]
        if n >= limit:
            raise UserError(
                f"eval prompt {p.id} is {n} tokens and the target's context is {limit}; shorten it or "
                "drop it from eval.prompts"
            )


def _trim(tokens: torch.Tensor, pad: int | None, eos: int | None) -> torch.Tensor:
    """Cut a row at its first EOS (inclusive) and drop trailing padding."""
    t = tokens.tolist()
    if eos is not None and eos in t:
        t = t[: t.index(eos) + 1]
    elif pad is not None:
        while t and t[-1] == pad:
            t.pop()
    return torch.tensor(t, dtype=torch.long)


def _run_baseline(
    name: str, target: nn.Module, ids: torch.Tensor, gen_kw: dict, assistant
) -> dict[str, float]:
    """Time one transformers baseline and count its target forwards (τ = new tokens / decode forwards)."""
    kw = dict(gen_kw)
    if name == "pld":
        kw["prompt_lookup_num_tokens"] = 10
    elif name == "assisted":
        if assistant is None:
            raise UserError("eval baseline 'assisted' needs eval.assistant_model=PATH_OR_ID")
        kw["assistant_model"] = assistant
    else:
        raise UserError(f"unknown eval baseline {name!r}; use pld or assisted")
    counter = ForwardCounter(target)
    try:
        out, secs = timed(target.generate, ids, attention_mask=torch.ones_like(ids), **kw)
    finally:
        counter.close()
    new = out.shape[1] - ids.shape[1]
    return {"time_s": secs, "new_tokens": new, "target_forwards": counter.count}


BASELINES = ("pld", "assisted")


def check_baselines(names: list[str], assistant: bool) -> None:
    """Refuse an unknown baseline name (or ``assisted`` without an assistant) before any work."""
    for name in names:
        if name not in BASELINES:
            raise UserError(f"unknown eval baseline {name!r} in eval.baselines; use {' or '.join(BASELINES)}")
        if name == "assisted" and not assistant:
            raise UserError("eval baseline 'assisted' needs eval.assistant_model=PATH_OR_ID")


def run_eval(
    target: nn.Module,
    tokenizer,
    drafters: dict[str, nn.Module | None],
    prompts: list,
    decode: DecodeConfig,
    baselines: list[str],
    assistant: nn.Module | None = None,
    warmup: int = 1,
    progress: bool = True,
) -> dict[str, list[TurnResult]]:
    """Warm up, then decode every turn of ``prompts`` with each named drafter (None: lookup
    alone) in one loop and each baseline once; returns each drafter's turns under its name."""
    from draftheads.decode import SpeculativeGenerator

    if not drafters:
        raise UserError("nothing to evaluate: give at least one drafter (heads=PATH)")
    check_prompts_fit(tokenizer, prompts, position_limit(target.config))
    device = next(target.parameters()).device
    generators = {
        name: SpeculativeGenerator(target, d, tokenizer=tokenizer, config=decode)
        for name, d in drafters.items()
    }
    for line in dict.fromkeys(line for g in generators.values() for line in g.backend_lines()):
        print(line, file=sys.stderr)  # each choice once
    # building a generator measured (or read) its verify-cost model: no timed call measures
    for _ in range(warmup):  # first calls pay one-off costs (allocation, packing)
        ids = encode_prompt(tokenizer, "Hello").to(device)
        for name in dict.fromkeys(["eager", *(g.backend for g in generators.values())]):
            with backends.applied(name, target):
                target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=8,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
        for generator in generators.values():
            plain = dict(max_new_tokens=8, do_sample=False)
            timed_retiring(target, generator.backend, generator.packs, ids, torch.ones_like(ids), **plain)
            generator.generate(ids, max_new_tokens=8)
    with torch.inference_mode():
        return evaluate_prompts(
            target, tokenizer, generators, prompts, decode.max_new_tokens, baselines, assistant, progress
        )
