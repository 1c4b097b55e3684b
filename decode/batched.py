"""Plain batched generation that retires finished rows: the loop behind distillation.

transformers' ``generate`` keeps every row of a batch in every forward until the longest answer
ends, so a batch whose answers have very different lengths spends much of its compute on rows
that are already done. Here a row that emits a stop token is retired: once retired rows make up
a tenth of the batch, their rows leave every layer's keys and values, and every later forward
costs only the rows still answering. The prefill computes the vocabulary
projection for the last position only, and runs a prefix that every prompt shares (a chat
template's system prompt: 26 of SmolLM2's prompt tokens) once instead of once per row.

After the prefill the keys and values move into fixed-capacity buffers (``StaticKV``, as in the
static verify path): each step writes one slot per row in place and attends over the slots
filled so far (``span``). A growing cache would copy every layer's keys and values at every
step (``torch.cat``), which at a batch of 32 and a few hundred positions moves more memory than
the weights themselves.

Greedy decoding picks the target's argmax at every position, as ``generate`` does; sampling draws
from the same distribution (temperature, then top-p: :func:`draftheads.decode.verify.warp`).
:func:`batched_generate` returns a function with ``generate``'s calling convention, so it plugs
into :func:`draftheads.data.distill.generate.decoder_generate`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache

from draftheads.decode.kv import new_cache, slot_positions
from draftheads.decode.static import KVPool, StaticKV
from draftheads.decode.verify import warp
from draftheads.heads.masks import padded_causal, recurrent_kinds, target_attention_mask

# retired rows are dropped from the batch once they are at least this share of it: at a batch of
# 32, a retired row wastes a row's forward (~2 ms here) at every step, and dropping rows copies
# every layer's cache (~5-10 ms), so a few idle rows are worth one copy (on the bench's 960
# prompts, 3% of the row-steps are idle at a tenth, 7% at a quarter)
COMPACT_SHARE = 0.1
# a prefix shared by every prompt is run once when it is at least this long (shorter ones are not
# worth a second forward)
MIN_SHARED = 8


def next_tokens(
    logits: torch.Tensor, do_sample: bool, temperature: float, top_p: float, top_k: int = 0
) -> torch.Tensor:
    """One token per row: the argmax, or a draw from the warped distribution."""
    if not do_sample:
        return logits.argmax(-1)
    return torch.multinomial(warp(logits, temperature, top_k, top_p), 1)[:, 0]


def last_only(model) -> dict:
    """``logits_to_keep=1`` where the model accepts it: only the last position's row of the
    vocabulary projection is computed."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def dtype_of(model) -> torch.dtype:
    return next(model.parameters()).dtype


def last_logits(model, keep: dict, **inputs) -> torch.Tensor:
    """The logits at the last position ``[B, V]`` (``keep``: :func:`last_only` of the model)."""
    return model(**inputs, **keep, use_cache=True).logits[:, -1].float()


def shared_prefix(input_ids: torch.Tensor, mask: torch.Tensor) -> int:
    """How many leading tokens every left-padded row has in common, leaving each row at least
    one token of its own (0 for a single row, or a mask that is not plain left padding)."""
    B, W = input_ids.shape
    lens = mask.sum(-1)
    left = torch.arange(W, device=mask.device) >= (W - lens)[:, None]
    n = int(lens.min()) - 1
    if B < 2 or n < 1 or not torch.equal(mask.bool(), left):
        return 0
    heads = input_ids.gather(1, (W - lens)[:, None] + torch.arange(n, device=mask.device))
    return int((heads == heads[:1]).all(0).long().cumprod(0).sum())


def prefill_prompts(
    model, keep: dict, input_ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, torch.Tensor]:
    """The prompts' cache and last logits: ``(logits [B, V], cache, mask [B, W], positions [B, W])``.

    Positions count real tokens only, so a left-padded row starts at position 0. A prefix that
    every row shares (a chat template's system prompt) is run once, for one row, and its keys
    and values broadcast to all: the cache then holds that prefix at slots ``[0, P)`` for every
    row and each row's own tokens left-padded after it (the returned mask says which slots are
    real). Keys carry their positions, so the layout changes which slots hold a token, not what
    any token sees.
    """
    B, W = input_ids.shape
    P = shared_prefix(input_ids, mask)
    cache = new_cache(model, keep=0)
    if P < MIN_SHARED:
        pos = slot_positions(mask)
        causal = target_attention_mask(model.config, padded_causal(mask), pos, pos, dtype_of(model))
        logits = last_logits(
            model, keep, input_ids=input_ids, attention_mask=causal, position_ids=pos, cache=cache
        )
        return logits, cache, mask, pos
    start = W - int(mask[0].sum())
    head = input_ids[:1, start : start + P]
    model(
        input_ids=head,
        position_ids=torch.arange(P, device=head.device)[None],
        cache=cache,
        use_cache=True,
        **keep,
    )
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1)
    # the columns after the first P hold each row's own tokens, right-aligned; the prefix tokens
    # that fall among them (rows shorter than W) are masked like padding
    cols = torch.arange(W, device=mask.device)
    own = (cols >= (W - mask.sum(-1) + P)[:, None])[:, P:].to(mask.dtype)
    mask = torch.cat([torch.ones_like(mask[:, :P]), own], 1)
    pos = slot_positions(mask)
    own_rows = padded_causal(mask)[:, P:]  # the rows' own tokens over the prefix and themselves
    causal = target_attention_mask(model.config, own_rows, pos[:, P:], pos, dtype_of(model))
    logits = last_logits(
        model, keep, input_ids=input_ids[:, P:], attention_mask=causal, position_ids=pos[:, P:], cache=cache
    )
    return logits, cache, mask, pos


@torch.no_grad()
def generate_retiring(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    top_k: int = 0,
) -> torch.Tensor:
    """``[B, W + n]``: the left-padded prompts and up to ``max_new_tokens`` new tokens per row.

    A row ends at its first stop token (written, then repeated to the end of the row); the loop
    stops when every row has ended.
    """
    B, W = input_ids.shape
    dev = input_ids.device
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
    stop_ids = (
        []
        if eos_token_id is None
        else [eos_token_id]
        if isinstance(eos_token_id, int)
        else list(eos_token_id)
    )
    fill = int(stop_ids[0]) if stop_ids else 0
    if recurrent_kinds(model.config):  # recurrent layers keep their own states: transformers' loop
        return recurrent_generate(
            model, input_ids, mask, max_new_tokens, do_sample, temperature, top_p, top_k, stop_ids
        )
    stops = torch.tensor(stop_ids, dtype=torch.long, device=dev)
    out = torch.full((B, max_new_tokens), fill, dtype=torch.long, device=dev)
    keep_last = last_only(model)  # checked once, not per step
    logits, prefill, mask, pos = prefill_prompts(model, keep_last, input_ids, mask)
    cache = StaticKV.adopt(prefill, KVPool(), max_new_tokens)
    del prefill
    allowed = torch.zeros(B, cache.capacity, dtype=torch.bool, device=dev)  # cache slots a row sees
    allowed[:, :W] = mask.bool()
    dtype = dtype_of(model)
    rows = torch.arange(B, device=dev)  # which output row each batch row writes
    live = torch.ones(B, dtype=torch.bool, device=dev)  # not yet ended (batch rows)
    nxt = pos[:, -1] + 1
    steps = 0
    for t in range(max_new_tokens):
        tok = next_tokens(logits, do_sample, temperature, top_p, top_k)
        tok = torch.where(live, tok, fill)
        out[rows, t] = tok
        steps = t + 1
        live &= ~torch.isin(tok, stops)
        if not live.any() or t + 1 == max_new_tokens:
            break
        if (~live).sum() >= COMPACT_SHARE * len(live):
            keep = live.nonzero()[:, 0]
            for layer in cache.layers:  # a new tensor is copied into buffers for the smaller batch
                layer.keys, layer.values = layer.keys[keep], layer.values[keep]
            rows, live, tok, allowed, nxt = rows[keep], live[keep], tok[keep], allowed[keep], nxt[keep]
        S = W + t  # the slot of this step's token
        allowed[:, S] = True
        cache.write_index = torch.tensor([S], device=dev)
        cache.span = S + 1  # attend over the filled slots only, not the whole capacity
        logits = last_logits(
            model,
            keep_last,
            input_ids=tok[:, None],
            attention_mask=target_attention_mask(
                model.config,
                allowed[:, None, : S + 1],
                nxt[:, None],
                slot_positions(allowed[:, : S + 1]),
                dtype,
            ),
            position_ids=nxt[:, None],
            cache=cache,
        )
        cache.set_length(S + 1)
        nxt = nxt + 1
    return torch.cat([input_ids, out[:, :steps]], dim=1)


def recurrent_generate(
    model,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    max_new_tokens: int,
    do_sample: bool,
    temperature: float,
    top_p: float,
    top_k: int,
    stops: list[int],
) -> torch.Tensor:
    """:func:`generate_retiring`'s result for a target with recurrent layers (Qwen3.5), whose states
    the static key/value buffers cannot hold: transformers' ``generate``, a row ending at its first
    stop token, which is then repeated to the end of the row (the same layout)."""
    return model.generate(
        input_ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature if do_sample else None,
        top_p=top_p if do_sample else None,
        top_k=top_k if do_sample else None,
        eos_token_id=stops or None,
        pad_token_id=stops[0] if stops else 0,
    )


def batched_generate(model) -> Callable[..., torch.Tensor]:
    """``generate_retiring`` bound to ``model``, with ``generate``'s keyword arguments."""

    def generate(input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        return generate_retiring(model, input_ids, **kwargs)

    return generate
