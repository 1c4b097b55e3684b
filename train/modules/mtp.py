"""The MTP objective: the head unrolled recursively for ``num_speculative_steps`` steps, each step's
token distilled from the target's distribution, the steps weighted by FastMTP's normalised
exponential decay; no feature regression.

The unroll, the teacher and the held-out chains are EAGLE's (:mod:`draftheads.train.unroll`,
:class:`~draftheads.train.modules.eagle.EagleObjective`): step k at row t reads the target's
final state at t (k = 0) or the head's own output of step k - 1 at row t, with the token
x_{t+k+1}, and attends as a decoded chain does, so what trains is what drafts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.train import TrainConfig
from draftheads.train.modules.costs import DraftCost
from draftheads.train.modules.eagle import EagleObjective, eagle_cost, teacher_soft_ce
from draftheads.train.objectives import (
    Stats,
    head_stats,
    label_mask,
    masked_mean,
)
from draftheads.train.unroll import unroll

if TYPE_CHECKING:
    from draftheads.heads.mtp import MTPDrafter


def step_weights(beta: float, steps: int) -> list[float]:
    """FastMTP's step weights (arXiv:2509.18362, eq. 2), for k = 0 .. steps - 1::

        alpha_k = beta**k / sum_{j < steps} beta**j

    They sum to 1, so the loss keeps its scale whatever the number of steps, and the nearer
    steps (the ones a chain reaches most often) weigh most for beta < 1."""
    raw = [beta**k for k in range(steps)]
    total = sum(raw)
    return [w / total for w in raw]


class MTPObjective(EagleObjective):
    """L = sum_{k < K} alpha_k * softCE(q_k, p_{t+k+1}) over the counted rows of each step, where
    q_k is the head's distribution at step k (through the target's lm_head) and p the target's
    at the position it predicts (projected once per position, or its cached top-k)."""

    @classmethod
    def eval_depth(cls, d: DraftConfig) -> int:
        return d.num_speculative_steps

    def split(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The final state is both the head's input and its teacher's state (read once)."""
        return feats, feats

    def steps(self) -> int:
        return self.cfg.num_speculative_steps

    def forward(self, batch: dict, step: int = 0) -> tuple[torch.Tensor, Stats]:
        final = self.features(batch)
        teacher = self.teacher(final, batch["loss_mask"], batch.get("topk_ids"), batch.get("topk_logits"))
        pos = batch.get("position_ids")
        K = self.steps()
        counted = [label_mask(batch["loss_mask"], k + 2, pos) for k in range(K)]
        outs = unroll(self.drafter, final[:, :-1], batch["input_ids"], K, pos, counted)
        total = final.new_zeros(())
        stats: Stats = {}
        for k, (alpha, out) in enumerate(zip(step_weights(self.cfg.step_weight_decay, K), outs)):
            loss, st = self.token_loss(k, out, counted[k], teacher)
            total = total + alpha * loss
            stats.update(st)
        return total, stats

    def token_loss(
        self, k: int, out: torch.Tensor, counted_rows: torch.Tensor, teacher: dict
    ) -> tuple[torch.Tensor, Stats]:
        """Step k's soft cross-entropy, a mean over the rows t that count a prediction of
        x_{t+k+2} (``counted_rows``); step k at row t is read against the target at t+k+1."""
        R = out.shape[1]
        b, t = counted_rows[:, :R].nonzero(as_tuple=True)
        index = teacher["index"][b, t + k + 1]
        logits = self.drafter.logits(out[b, t])
        ce = teacher_soft_ce(logits, teacher, index)
        loss = masked_mean(ce, torch.ones_like(ce))
        return loss, head_stats(f"step{k}", loss, logits, teacher["greedy"][index], self.topk)


def mtp_training(
    drafter: MTPDrafter, d: DraftConfig, t: TrainConfig, S: int, element: int, online: bool
) -> DraftCost:
    """EAGLE-1's cost over ``num_speculative_steps`` passes: fc once, then the layer and the
    target's head per step (see :func:`~draftheads.train.modules.eagle.eagle_cost`); the token
    loss reads the target's logits, projected online unless they are cached (top-k)."""
    return eagle_cost(drafter, d, S, element, online and t.soft_labels != "topk", d.num_speculative_steps)
