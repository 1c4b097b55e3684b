"""Target features: what a drafter reads from the frozen target (online or from a cache)."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def target_features(
    target: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layers: list[int],
    with_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the frozen target once and return ``(features [B,T,F], logits [B,T,V] or None)``.

    ``features`` concatenates ``hidden_states[i]`` for ``i in layers`` (index i is the input of
    layer i; index num_layers is the final normed state the lm_head sees), exactly what
    ``Drafter.select_features`` picks, so online and cached features are the same tensors.
    """
    out = target(
        input_ids=input_ids,
        attention_mask=attention_mask,
        output_hidden_states=True,
        logits_to_keep=0 if with_logits else 1,
        use_cache=False,
    )
    feats = [out.hidden_states[i] for i in layers]
    f = feats[0] if len(feats) == 1 else torch.cat(feats, dim=-1)
    return f, (out.logits if with_logits else None)
