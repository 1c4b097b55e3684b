"""The plain decoding every speed-up is measured against: the fastest plain loop on the backend.

Two plain loops decode on the decoder's backend (e.g. pre-packed oneDNN weights), each timed on
the same prompts in the same run:

* transformers' ``generate``, which keeps every row of a batch in every forward until the
  longest answer ends;
* the project's own batched loop (:func:`draftheads.decode.batched.generate_retiring`), whose
  finished rows leave the batch, as the speculative decoder's do, and whose keys and values sit
  in fixed buffers.

A speed-up is the speculative rate over the faster of the two (``fastest``), so that a slow
baseline never flatters the decoder; both rates are reported beside it. The retiring loop
samples with temperature, top-k and top-p alone: where the call's settings add any other
processor (a repetition penalty, say), only ``generate`` samples the target's distribution and
it alone is the baseline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import backend as backends
from draftheads.decode.batched import generate_retiring
from draftheads.decode.processing import build as build_processors
from draftheads.decode.processing import resolve

# the processors the retiring loop applies itself (decode/verify.py ``warp``), in generate's order
WARPERS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper")


@dataclass
class PlainRun:
    """One plain loop's output ``[B, W + n]``, its seconds and its new tokens (all rows)."""

    output: torch.Tensor
    seconds: float
    new_tokens: int


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def count_new(new: torch.Tensor, eos: int | list[int] | None, pad: int | None) -> int:
    """New tokens of every row of ``new [B, n]``: up to its first stop token (inclusive), else
    without trailing padding."""
    stops = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    total = 0
    for row in new.tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stops), None)
        if cut is None:
            while row and pad is not None and row[-1] == pad:
                row.pop()
            cut = len(row)
        total += cut
    return total


def retiring_settings(target: nn.Module, kw: dict, n_prompt: int) -> dict | None:
    """The retiring loop's arguments (stop tokens, sampling) for ``generate``'s keywords ``kw`` as
    ``generate`` resolves them (the target's generation config, transformers' defaults), or None
    where the resolved settings add a processor the loop does not apply."""
    gc = resolve(target, DecodeConfig(), None, dict(kw))
    device = next(target.parameters()).device
    processors = build_processors(target, gc, n_prompt, gc.max_new_tokens or 1, device)
    if any(type(p).__name__ not in WARPERS for p in processors):
        return None
    how = {"eos_token_id": gc.eos_token_id, "do_sample": bool(gc.do_sample)}
    if gc.do_sample:
        how.update(
            temperature=float(gc.temperature or 1.0),
            top_k=int(gc.top_k or 0),
            top_p=float(gc.top_p if gc.top_p is not None else 1.0),
        )
    return how


def timed_generate(
    target: nn.Module, backend: str, packs, ids: torch.Tensor, mask: torch.Tensor, **kw
) -> PlainRun:
    """transformers' ``generate`` on ``backend`` (``kw``: its keywords, ``eos_token_id`` and
    ``pad_token_id`` among them)."""
    with backends.applied(backend, target, cache=packs):
        _sync()
        t0 = time.perf_counter()
        out = target.generate(ids, attention_mask=mask, **kw)
        _sync()
        seconds = time.perf_counter() - t0
    eos = kw.get("eos_token_id", getattr(target.generation_config, "eos_token_id", None))
    return PlainRun(out, seconds, count_new(out[:, ids.shape[1] :], eos, kw.get("pad_token_id")))


def timed_retiring(
    target: nn.Module, backend: str, packs, ids: torch.Tensor, mask: torch.Tensor, **kw
) -> PlainRun | None:
    """The retiring loop on ``backend`` for ``generate``'s keywords ``kw``; None where it cannot
    sample the call's distribution (:func:`retiring_settings`)."""
    how = retiring_settings(target, kw, int(mask.sum(-1).max()))
    if how is None:
        return None
    with backends.applied(backend, target, cache=packs):
        _sync()
        t0 = time.perf_counter()
        out = generate_retiring(target, ids, mask, max_new_tokens=kw["max_new_tokens"], **how)
        _sync()
        seconds = time.perf_counter() - t0
    new = count_new(out[:, ids.shape[1] :], how["eos_token_id"], kw.get("pad_token_id"))
    return PlainRun(out, seconds, new)


def fastest(generate_rate: float, retiring_rate: float | None) -> tuple[str, float]:
    """``(name, tokens/s)`` of the faster plain loop (``retiring_rate`` None: not run)."""
    if retiring_rate is not None and retiring_rate > generate_rate:
        return "retiring", retiring_rate
    return "generate", generate_rate
