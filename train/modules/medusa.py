"""The Medusa objectives: Medusa-1's heads on a frozen target, and Medusa-2's heads trained
jointly with LoRA adapters on the target (self-distilled against the target without them).

Head k (0-based) reads the target's state f_t at row t and predicts x_{t+k+2} (label offset
k + 2, :func:`~draftheads.train.objectives.future_labels`): the target itself predicts x_{t+1}.

Medusa-2's adapted target *is* a submodule (its adapters train); only the adapter parameters
require gradients, and the heads learn at ``draft.medusa.head_lr_multiplier`` times their learning rate.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads import Drafter
from draftheads.heads.features import packed_inputs
from draftheads.train.adapters import add_lora
from draftheads.train.modules.base import Objective, chunked_argmax
from draftheads.train.objectives import (
    IGNORE,
    Stats,
    future_labels,
    head_stats,
    head_warmup,
    kl_to_teacher,
    label_mask,
    masked_mean,
    shift_left,
)


def medusa_loss(
    head_hidden: torch.Tensor,
    logits_fn,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    weight: float,
    decay: float,
    topk: int = 5,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """Medusa-1: L = sum_k weight * decay**k * CE(head_k(f_t), x_{t+k+2}) over counted positions.

    ``head_hidden`` is ``[K, B, T, H]`` (each head's ResBlock output) and ``logits_fn(k, h)``
    applies head k's lm_head. Logits are only formed for the counted rows, so the vocabulary
    projection costs nothing on prompt and padding tokens.
    """
    total = head_hidden.new_zeros(())
    stats: Stats = {}
    for k in range(head_hidden.shape[0]):
        labels = future_labels(input_ids, loss_mask, k + 2, position_ids)
        rows = labels != IGNORE
        y = labels[rows]
        logits = logits_fn(k, head_hidden[k][rows]).float()
        ce = F.cross_entropy(logits, y, reduction="sum") / max(y.numel(), 1)
        total = total + weight * decay**k * ce
        stats.update(head_stats(f"head{k}", ce, logits, y, topk))
    return total, stats


class MedusaObjective(Objective):
    """Medusa-1: heads on a frozen target (see :func:`medusa_loss`)."""

    eval_label = ("head", 0)

    @classmethod
    def build(cls, drafter: Drafter, target: nn.Module, d: DraftConfig, topk: int) -> Objective:
        """Medusa-2 (``draft.medusa.lora``) first adds LoRA adapters to the target and marks the heads as
        needing them."""
        if d.lora:
            drafter.requires_adapters = True
            return Medusa2Objective(drafter, add_lora(target, d), d, topk)
        return cls(drafter, target, d, topk)

    @classmethod
    def eval_depth(cls, d: DraftConfig) -> int:
        return d.num_heads

    @classmethod
    def init_head(cls, drafter: Drafter, tokens: Sequence[dict]) -> dict[str, float]:
        """Copied lm_heads (Medusa-1) start as the target's."""
        drafter.init_lm_heads_from_target()
        return {}

    def head_loss(self, h: torch.Tensor, batch: dict) -> tuple[torch.Tensor, Stats]:
        return medusa_loss(
            self.drafter.head_hidden(h),
            self.drafter.head_logits,
            batch["input_ids"],
            batch["loss_mask"],
            self.cfg.head_loss_weight,
            self.cfg.head_loss_decay,
            self.topk,
            batch.get("position_ids"),
        )

    def forward(self, batch: dict, step: int = 0) -> tuple[torch.Tensor, Stats]:
        return self.head_loss(self.features(batch), batch)

    @torch.no_grad()
    def chains(self, batch: dict, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Head k at t against the target's greedy token at t+k+1 (its guess of x_{t+k+2})."""
        h = self.features(batch)
        greedy = chunked_argmax(self.lm_head, h)
        hh = self.drafter.head_hidden(h)
        correct, valid = [], []
        for k in range(min(depth, hh.shape[0])):
            pred = chunked_argmax(lambda x, k=k: self.drafter.head_logits(k, x), hh[k])
            correct.append(pred == shift_left(greedy, k + 1, -1))
            valid.append(label_mask(batch["loss_mask"], k + 2, batch.get("position_ids")))
        return torch.stack(correct), torch.stack(valid)


class Medusa2Objective(MedusaObjective):
    """Medusa-2: heads plus LoRA adapters on the target, trained jointly.

    L = self_distill_weight * KL(target without adapters || target with adapters)
        + s(step) * sum_k head_loss_weight * decay**k * CE_k,
    with s the head warm-up; heads learn at ``head_lr_multiplier`` times the adapters' lr.
    """

    def __init__(self, drafter: Drafter, adapted: nn.Module, cfg: DraftConfig, topk: int) -> None:
        super().__init__(drafter, adapted, cfg, topk)
        self.adapted = adapted  # registered: its LoRA parameters train

    def features(self, batch: dict) -> torch.Tensor:
        out = self.adapted(
            input_ids=batch["input_ids"],
            **packed_inputs(self.adapted, batch["attention_mask"], batch.get("position_ids")),
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=1,
        )
        return out.hidden_states[self.num_layers].to(self.dtype)

    def forward(self, batch: dict, step: int = 0) -> tuple[torch.Tensor, Stats]:
        h = self.features(batch)
        with torch.no_grad(), self.adapted.disable_adapter():
            teacher = self.features(batch)
        rows = shift_left(batch["loss_mask"], 1).bool()  # positions whose next token is assistant
        kl = kl_to_teacher(self.lm_head(h[rows]), self.lm_head(teacher[rows]))
        distill = masked_mean(kl, torch.ones_like(kl))
        heads, stats = self.head_loss(h, batch)
        warm = head_warmup(self.cfg.head_warmup, step, self.cfg.head_warmup_steps)
        n = kl.new_tensor(float(kl.numel()))
        stats.update({"distill/loss_sum": distill.detach() * n, "distill/n": n})
        return self.cfg.self_distill_weight * distill + warm * heads, stats

    def param_groups(self, lr: float) -> list[dict]:
        heads = [p for p in self.drafter.parameters() if p.requires_grad]
        ids = {id(p) for p in heads}
        lora = [p for p in self.adapted.parameters() if p.requires_grad and id(p) not in ids]
        return [
            {"params": heads, "lr": lr * self.cfg.head_lr_multiplier, "name": "heads"},
            {"params": lora, "lr": lr, "name": "lora"},
        ]
