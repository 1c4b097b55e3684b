"""What every training objective shares: the drafter as the trained submodule, the frozen target
held outside the module tree, and the target features the drafter reads.

The target sits in a plain dict, so it never reaches the optimizer, a ZeRO partition or a
checkpoint; :meth:`Objective.features` gives its hidden states (computed online, or read from a
feature cache's batch) in the drafter's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads import Drafter
from draftheads.heads.features import target_features


def chunked_argmax(
    fn: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, chunk: int = 512
) -> torch.Tensor:
    """argmax(fn(h), -1) over the leading dims of ``h`` without holding all logits at once."""
    flat = h.reshape(-1, h.shape[-1])
    out = torch.cat([fn(flat[i : i + chunk]).argmax(-1) for i in range(0, flat.shape[0], chunk)])
    return out.reshape(h.shape[:-1])


class Objective(nn.Module):
    """A drafter plus its loss: ``forward(batch, step) -> (loss, stats)`` for DeepSpeed, and
    ``chains(batch, depth)`` for the held-out evaluation (defined by each family)."""

    def __init__(self, drafter: Drafter, target: nn.Module, cfg: DraftConfig, topk: int) -> None:
        super().__init__()
        self.drafter = drafter
        self.cfg, self.topk = cfg, topk
        self._frozen = {"target": target}
        self.num_layers = drafter.target_fingerprint.num_layers

    @property
    def target(self) -> nn.Module:
        return self._frozen["target"]

    def layers(self) -> list[int]:
        """The target hidden states this objective reads (also what a feature cache must hold)."""
        return self.drafter.training_layers()

    @property
    def dtype(self) -> torch.dtype:
        """The drafter's compute dtype (its trainable weights', after DeepSpeed's casting)."""
        params = [p for p in self.drafter.parameters() if p.requires_grad] or list(self.drafter.parameters())
        return params[0].dtype

    def features(self, batch: dict) -> torch.Tensor:
        """The target's states for the drafter, in the drafter's dtype: a bfloat16 cache or
        target meets an fp32 drafter here, and nowhere else."""
        if "features" in batch:  # offline: cached by draftheads features
            return batch["features"].to(self.dtype)
        f, _ = target_features(
            self.target,
            batch["input_ids"],
            batch["attention_mask"],
            self.layers(),
            position_ids=batch.get("position_ids"),
        )
        return f.to(self.dtype)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.drafter.shared("lm_head")(h)

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": [p for p in self.parameters() if p.requires_grad], "lr": lr, "name": "drafter"}]
