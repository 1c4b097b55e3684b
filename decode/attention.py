"""transformers' SDPA attention with grouped-query heads folded under a mask.

A grouped-query target (SmolLM2: 9 query heads share 3 key/value heads) reads each key/value head
``g = H / H_kv`` times. transformers' SDPA path attends with ``enable_gqa`` only when no mask is
passed (a plain greedy step); under a mask, the decoder's every verify step, it first copies each
layer's whole cache ``g`` times (``repeat_kv``), a copy that grows with the context.
:func:`~draftheads.heads.attention.grouped_attention` folds the query groups instead (the math is
stated there): the same attention, no copy.

:func:`grouped` switches a target's (and a drafter's) ``sdpa`` attention to this one inside a
block; the decoder's backend blocks (:mod:`~draftheads.decode.backend`) enter it, so the decoder,
its cost model and the same-backend greedy baseline all run it. Without a mask, or without
grouped heads, it is transformers' own SDPA call.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from draftheads.heads.attention import foldable, grouped_attention

NAME = "draftheads_grouped_sdpa"
_LOCK = threading.Lock()
_HELD: dict[int, list] = {}  # id(config) -> [config, blocks inside, its implementation before]
_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its head_configs
_CAUSAL: tuple = (lambda: None, False)  # the last mask plain_causal checked (weakly), its answer


def grouped_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, n, D]``, ``key``/``value``
    ``[B, H_kv, S, D]``; returns ``[B, n, H, D]``. Folds the query groups under a mask (module
    docstring); otherwise transformers' ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and plain_causal(attention_mask, query.shape[2], key.shape[2]):
        attention_mask, is_causal = None, True  # a prompt read whole: transformers' causal call
    if not foldable(query, key, attention_mask) or (dropout and module.training):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    out = grouped_attention(query, key, value, attention_mask, scaling)
    return out.transpose(1, 2).contiguous(), None


def plain_causal(mask: torch.Tensor, n: int, S: int) -> bool:
    """Whether ``mask [B or 1, 1, n, S]`` (additive or boolean) is plain causal attention over
    keys that are the queries themselves (``n == S``: prompts read whole into an empty cache, no
    row padded): then SDPA's own causal kernel serves it, as it serves ``generate``'s prefill,
    without the ``g·n × S`` mask a folded call copies per layer. The answer for the last mask
    checked is kept while that tensor lives: every layer of a forward gets the same mask."""
    global _CAUSAL
    if n != S or n < 2 or (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False  # a captured graph replays later masks through the same buffer: keep the mask
    last, answer = _CAUSAL
    if last() is mask:
        return answer
    allowed = mask if mask.dtype == torch.bool else mask == 0
    want = torch.ones(n, S, dtype=torch.bool, device=mask.device).tril()
    answer = bool((allowed == want).all())
    _CAUSAL = (weakref.ref(mask), answer)
    return answer


def register() -> None:
    """Make :data:`NAME` an attention implementation transformers can dispatch to, with SDPA's masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(NAME, grouped_sdpa)
        AttentionMaskInterface.register(NAME, sdpa_mask)


def head_configs(module: nn.Module) -> list:
    """The distinct configs with attention heads among ``module``'s submodules, found once per
    module: walking every submodule cost a few milliseconds, and :func:`grouped` is entered
    around every decoding step (a loaded model's layers stay the same while it decodes)."""
    found = _FOUND.get(module)
    if found is None:
        seen: dict[int, object] = {}
        for m in module.modules():
            c = getattr(m, "config", None)
            if hasattr(c, "num_attention_heads"):
                seen.setdefault(id(c), c)
        found = _FOUND[module] = list(seen.values())
    return found


def sdpa_configs(*modules: nn.Module) -> list:
    """The distinct model configs inside ``modules`` whose attention is transformers' ``sdpa``
    (read now: an implementation may change between calls)."""
    found: dict[int, object] = {}
    for module in modules:
        for c in head_configs(module):
            if getattr(c, "_attn_implementation", None) in ("sdpa", NAME):
                found.setdefault(id(c), c)
    return list(found.values())


@contextmanager
def grouped(*modules: nn.Module) -> Iterator[None]:
    """``modules``' SDPA attention is :func:`grouped_sdpa` inside the block. Blocks nest and may
    overlap across threads: a config gets its own implementation back when its last block ends."""
    register()
    with _LOCK:
        configs = sdpa_configs(*modules)
        for c in configs:
            held = _HELD.setdefault(id(c), [c, 0, c._attn_implementation])
            held[1] += 1
            c._attn_implementation = NAME
    try:
        yield
    finally:
        with _LOCK:
            for c in configs:
                held = _HELD[id(c)]
                held[1] -= 1
                if held[1] == 0:
                    del _HELD[id(c)]
                    c._attn_implementation = held[2]
