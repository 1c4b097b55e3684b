"""An imported checkpoint's copies of the target's own tensors must be the target's.

A kind's official files may carry the embedding, or an lm_head, that the drafter shares with its
target (the kind's converter calls these checks). draftheads shares the target's own tensors and
drops the copies, but first compares them: a copy that differs means the drafter was trained for
another model.
"""

from __future__ import annotations

import torch
from torch import nn

from draftheads.conf.errors import UserError


def check_embedding(sd: dict[str, torch.Tensor], target: nn.Module, where: str) -> None:
    """An embedding copy in the checkpoint must be the target's: otherwise it was trained for another model."""
    emb = sd.get("embed_tokens.weight")
    if emb is None:
        return
    own = target.get_input_embeddings().weight.detach().to("cpu", torch.float32)
    if tuple(emb.shape) != tuple(own.shape) or not torch.allclose(emb.float(), own, rtol=1e-2, atol=1e-3):
        raise UserError(
            f"{where}: its embed_tokens copy differs from the target's embedding; the drafter was trained "
            "for another target model, load it with that one"
        )


def check_shared_rows(weight: torch.Tensor, target: nn.Module, ids: torch.Tensor, where: str) -> None:
    """An lm_head in the file must be the target's (its rows ``ids``): draftheads shares the target's."""
    own = target.get_output_embeddings().weight.detach().to("cpu", torch.float32)
    if tuple(weight.shape) != (ids.numel(), own.shape[1]) or not torch.allclose(
        weight.float(), own[ids], rtol=1e-2, atol=1e-3
    ):
        raise UserError(
            f"{where}: its lm_head.weight is not the target's lm_head (rows of the draft vocabulary); draftheads "
            "drafts with the target's own head, so load it with the target it was trained for"
        )
