"""Drafter layers started as the target's own (``draft.<kind>.init_from_target``).

A drafter decoder layer that shares the target's layout (names and shapes of its q/k/v/o,
MLP and norms) can start from a trained target layer instead of random weights: a kind whose
drafter has such layers copies the target's last ones (its ``init_from_target``). Parameters the
target has no counterpart for (say q/k norms a Llama target lacks) keep their initialisation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.target.layers import decoder_layers

# (the drafter's tensor, the target's) -> the target's weight reshaped to fit, or None to skip it
Adapt = Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]


def last_layers(target: nn.Module, n: int, kind: str) -> list[nn.Module]:
    """The target's last ``n`` layers: drafter layer i starts as target layer L - n + i. Refuses a
    drafter (of draft.kind ``kind``) deeper than the target."""
    stack = list(decoder_layers(target))
    if n > len(stack):
        raise UserError(
            f"draft.{kind}.num_decoder_layers={n} with draft.{kind}.init_from_target=true: the target has only "
            f"{len(stack)} layers to copy; use at most {len(stack)} drafter layers, or draft.{kind}.init_from_target=false"
        )
    return stack[len(stack) - n :]


@torch.no_grad()
def copy_layer(mine: nn.Module, theirs: nn.Module, adapt: Adapt | None = None) -> list[str]:
    """Copy every tensor of ``theirs`` into the same-named tensor of ``mine`` whose shape matches
    (after ``adapt``, which may reshape a weight); returns the names copied."""
    src = {k: v.detach() for k, v in theirs.state_dict().items()}
    copied = []
    for name, value in mine.state_dict().items():
        if name not in src:
            continue
        w = src[name].to(value.dtype)
        if w.shape != value.shape and adapt is not None:
            w = adapt(value, w)
        if w is not None and w.shape == value.shape:
            value.copy_(w)
            copied.append(name)
    return copied
