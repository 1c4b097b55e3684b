"""Target features: what a drafter reads from the frozen target (online or from a cache)."""

from __future__ import annotations

import torch
from torch import nn

from draftheads.heads.masks import packed_causal, target_attention_mask


@torch.no_grad()
def target_features(
    target: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layers: list[int],
    with_logits: bool = False,
    position_ids: torch.Tensor | None = None,
    logits_at: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the frozen target once and return ``(features [B,T,F], logits [B,T,V] or None)``.

    ``features`` concatenates ``hidden_states[i]`` for ``i in layers`` (index i is the input of
    layer i; index num_layers is the final normed state the lm_head sees), exactly what
    ``Drafter.select_features`` picks, so online and cached features are the same tensors.
    With ``position_ids`` (packed rows), each document attends only to itself and starts at
    position 0, so its features equal those of the document alone.

    With ``logits_at`` (bool ``[B, T]``), the logits are ``[n, V]``: only the n marked positions,
    row-major, projected from the final state through the output embeddings. The vocabulary
    projection is about a fifth of a small target's forward, so a caller that needs logits at
    some positions only (a cache's labels, not its prompts or padding) skips most of it.
    """
    out = target(
        input_ids=input_ids,
        **packed_inputs(target, attention_mask, position_ids),
        output_hidden_states=True,
        logits_to_keep=0 if with_logits and logits_at is None else 1,
        use_cache=False,
    )
    feats = [out.hidden_states[i] for i in layers]
    f = feats[0] if len(feats) == 1 else torch.cat(feats, dim=-1)
    if logits_at is not None:
        return f, target.get_output_embeddings()(out.hidden_states[-1][logits_at])
    return f, (out.logits if with_logits else None)


def packed_inputs(
    target: nn.Module, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
) -> dict[str, torch.Tensor | None]:
    """The target's mask arguments: the 2-D padding mask, or for packed rows a block-diagonal
    causal 4-D mask with per-document positions, each layer kind keeping its own window (as
    the target sees each document alone). Rows are never packed for a target with recurrent
    layers, whose state would run on from one document into the next."""
    if position_ids is None:
        return {"attention_mask": attention_mask}
    dtype = next(target.parameters()).dtype
    allowed = packed_causal(position_ids, attention_mask)
    return {
        "attention_mask": target_attention_mask(target.config, allowed, position_ids, position_ids, dtype),
        "position_ids": position_ids,
    }
