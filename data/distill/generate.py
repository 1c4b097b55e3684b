"""Pluggable generation for distillation: token ids in, the target's new token ids out.

Everything in-process goes through a :data:`GenerateFn`, so distillation and self-prompting
(:mod:`draftheads.data.self_prompts`) do not care what decodes. :func:`hf_generate` wraps the
target's own ``model.generate``; :func:`decoder_generate` wraps any decoder with that calling
convention (:data:`DecodeFn`, e.g. a speculative decoder's ``generate``), which the caller
builds and passes in. Both left-pad a batch, cut each row before its first stop token and seed
sampling per call (:func:`batched`), which is what resuming a sampled run relies on. The target
runs inside a :data:`Runner` the caller passes (the commands pass ``data.distill.backend``
through :func:`draftheads.decode.backend.running`); :func:`stock` runs it as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class GenParams:
    """How each answer is generated: its token budget and the sampling distribution."""

    max_new_tokens: int
    temperature: float
    top_p: float

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


# (prompt token ids per row, params, seed) -> (new token ids per row, stopped at end-of-turn per row)
GenerateFn = Callable[[list[list[int]], GenParams, int], tuple[list[list[int]], list[bool]]]
# ``decode(input_ids, attention_mask=, max_new_tokens=, do_sample=, temperature=, top_p=,
# eos_token_id=) -> ids [B, T + new]``: transformers' ``generate`` calling convention.
DecodeFn = Callable[..., torch.Tensor]
# how the target runs while generating: model -> a context manager (an execution backend)
Runner = Callable[..., AbstractContextManager]


def stop_ids(model: nn.Module, tokenizer) -> list[int]:
    """The target's end-of-sequence ids: the tokenizer's and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen if isinstance(gen, list) else [gen])
    return sorted(i for i in ids if i is not None)


def batched(model: nn.Module, tokenizer, run: Callable) -> GenerateFn:
    """A :data:`GenerateFn` around ``run(ids, attention_mask, params, stops, pad) -> ids``.

    Prompts are left-padded into one batch; each output row ends before its first stop token.
    The seed makes sampling reproducible batch by batch (what resuming relies on).
    """
    stops = stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    device = model.get_input_embeddings().weight.device  # a sharded target's: where its embedding is

    @torch.no_grad()
    def generate(prompts: list[list[int]], p: GenParams, seed: int) -> tuple[list[list[int]], list[bool]]:
        width = max(len(x) for x in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, x in enumerate(prompts):
            ids[i, width - len(x) :] = torch.tensor(x)
            attn[i, width - len(x) :] = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = run(ids.to(device), attn.to(device), p, stops, pad)
        rows, stopped = [], []
        for seq in out[:, width:].tolist():
            cut = next((j for j, t in enumerate(seq) if t in stops), None)
            rows.append(seq if cut is None else seq[:cut])
            stopped.append(cut is not None)
        return rows, stopped

    return generate


def hf_generate(model: nn.Module, tokenizer) -> GenerateFn:
    """Batched ``model.generate``."""

    def run(ids: torch.Tensor, attn: torch.Tensor, p: GenParams, stops: list[int], pad: int) -> torch.Tensor:
        sampling = {} if p.greedy else {"temperature": p.temperature, "top_p": p.top_p, "top_k": 0}
        return model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=p.max_new_tokens,
            do_sample=not p.greedy,
            pad_token_id=pad,
            eos_token_id=stops,
            **sampling,
        )

    return batched(model, tokenizer, run)


def decoder_generate(model: nn.Module, tokenizer, decode: DecodeFn | None = None) -> GenerateFn:
    """Batched generation through ``decode`` (for example a speculative decoder's ``generate``,
    which gives :func:`hf_generate`'s output token for token under greedy decoding, faster);
    without one, the target's own ``generate``."""
    if decode is None:
        return hf_generate(model, tokenizer)

    def run(ids: torch.Tensor, attn: torch.Tensor, p: GenParams, stops: list[int], pad: int) -> torch.Tensor:
        return decode(
            ids,
            attention_mask=attn,
            max_new_tokens=p.max_new_tokens,
            do_sample=not p.greedy,
            temperature=p.temperature if not p.greedy else 1.0,
            top_p=p.top_p,
            top_k=0,  # as hf_generate: no top-k cut, whatever the model's generation config says
            eos_token_id=stops,
        )

    return batched(model, tokenizer, run)


def stock(model: nn.Module) -> AbstractContextManager:
    """Run the target as it is (no execution backend): the default ``runner``."""
    return nullcontext()
