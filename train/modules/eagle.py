"""The EAGLE objective (EAGLE-1 and EAGLE-3): the drafter unrolled over its test-time-training
steps, each step's features regressed and tokens distilled from the target's distribution
(projected once per position, or its cached top-k).

Step s at row t reads (f_t, x_{t+1}) at s = 0, then its own previous output with x_{t+s+1}, and
predicts f_{t+s+1} and x_{t+s+2}: its target position is ``p = t+s+1`` (labels of offset s + 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.train import TrainConfig
from draftheads.train.modules.base import Objective, chunked_argmax
from draftheads.train.modules.costs import DraftCost, attention_widths, count, layer_activation
from draftheads.train.objectives import (
    Stats,
    feature_regression,
    head_stats,
    label_mask,
    masked_mean,
    shift_left,
    soft_cross_entropy,
    sparse_soft_cross_entropy,
    topk_teacher,
    uniform_noise,
)
from draftheads.train.unroll import unroll
from draftheads.train.vocab import set_draft_vocab

if TYPE_CHECKING:
    from draftheads.heads.eagle import EagleDrafter


def eagle_cost(
    drafter: EagleDrafter, d: DraftConfig, S: int, element: int, online: bool, steps: float | None = None
) -> DraftCost:
    """EAGLE: fc once per token, then ``steps`` (default ``ttt_steps``) passes of the layers and
    the head per token.

    flops = 6 fc + T (6 layers + 6 S A n + (6 if the head trains else 4) H Vh)
    """
    T, H = d.ttt_steps if steps is None else steps, drafter.target_fingerprint.hidden_size
    A, _ = attention_widths(drafter.layer_config)
    n = len(drafter.layers)
    own_head = getattr(drafter, "lm_head", None)  # EAGLE-3 trains its own; EAGLE-1 reads the target's
    vocab = own_head.out_features if own_head is not None else drafter.target_fingerprint.vocab_size
    head_factor = 6 if own_head is not None else 4
    flops = 6 * count(drafter.fc) + T * (6 * count(drafter.layers) + 6 * S * A * n + head_factor * H * vocab)
    per_query = n * layer_activation(drafter.layer_config, element) + 8 * vocab
    widened = element * 2 * H if drafter.version == 3 else 0  # EAGLE-3: q/k/v read concat(embedding, feature)
    teacher = 4 * drafter.target_fingerprint.vocab_size if online else 0
    activation = T * (per_query + widened) + element * drafter.fc.in_features + teacher
    return DraftCost(flops, activation, online)


class EagleObjective(Objective):
    """EAGLE-1 and EAGLE-3, one loss with the version's defaults:

    L = sum_{s < steps} decay**s * [ w_f * SmoothL1(f'_s, f_{t+s+1}) + w_t * softCE(q_s, p_{t+s+1}) ]

    p = softmax of the target's logits at the target position; q = the drafter's. EAGLE-1:
    one step, full vocabulary through the frozen lm_head, uniform feature noise on the input.
    EAGLE-3: ``draft.eagle.ttt_steps`` steps, its own lm_head over the draft vocabulary, p restricted
    to that vocabulary, and positions whose target top-1 falls outside it not counted.
    """

    @classmethod
    def eval_depth(cls, d) -> int:
        return d.ttt_steps

    @classmethod
    def init_head(cls, drafter, tokens: Sequence[dict]) -> dict[str, float]:
        """EAGLE-3: the draft vocabulary from the rows, and its lm_head as the target's rows of it."""
        if drafter.version != 3:
            return {}
        coverage = set_draft_vocab(drafter, tokens)
        drafter.init_lm_head_from_target()
        return {"draft_vocab_coverage": coverage}

    def split(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(drafter input features, final target state) from the concatenated layers."""
        H = self.drafter.target_fingerprint.hidden_size
        return feats[..., :-H], feats[..., -H:]

    def steps(self) -> int:
        return self.cfg.ttt_steps if self.drafter.version == 3 else max(1, self.cfg.ttt_steps)

    def forward(self, batch: dict, step: int = 0) -> tuple[torch.Tensor, Stats]:
        inp, final = self.split(self.features(batch))
        teacher = self.teacher(final, batch["loss_mask"], batch.get("topk_ids"), batch.get("topk_logits"))
        inp = uniform_noise(inp[:, :-1], self.cfg.feature_noise)
        pos = batch.get("position_ids")
        counted = [label_mask(batch["loss_mask"], s + 2, pos) for s in range(self.steps())]
        outs = unroll(self.drafter, inp, batch["input_ids"], self.steps(), pos, counted)
        total = final.new_zeros(())
        stats: Stats = {}
        for s, out in enumerate(outs):
            loss, st = self.step_loss(s, out, final, counted[s], teacher)
            total = total + self.cfg.ttt_decay**s * loss
            stats.update(st)
        return total, stats

    @torch.no_grad()
    def teacher(
        self,
        final: torch.Tensor,
        loss_mask: torch.Tensor,
        topk_ids: torch.Tensor | None = None,
        topk_logits: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The target's logits, once per position p whose next token is counted (loss_mask[p+1]).

        Every TTT step reads the same positions shifted by one, so projecting each through the
        full-vocabulary lm_head once, instead of once per step, saves (steps - 1) of the
        largest matmuls of a step. Returns, compacted over those positions: ``index [B, T]``
        (row in the compact tensors, -1 elsewhere), ``greedy`` (full-vocabulary argmax) and
        ``logits`` (over the draft vocabulary for EAGLE-3, the full one for EAGLE-1).

        With the target's cached top-k logits (``topk_ids``/``topk_logits [B, T, k]``, sorted),
        nothing is projected: ``greedy`` is the top-1 and the soft labels are the renormalised
        top-k mapped into the drafter's vocabulary (``ids``/``probs``, see :func:`topk_teacher`).
        """
        where = shift_left(loss_mask, 1).bool()
        index = torch.where(where, where.long().flatten().cumsum(0).view_as(where) - 1, -1)
        if topk_ids is not None and topk_logits is not None:
            t2d = self.drafter.t2d if self.drafter.version == 3 else None
            ids, probs = topk_teacher(topk_ids[where], topk_logits[where], t2d)
            return {"index": index, "greedy": topk_ids[where][:, 0].long(), "ids": ids, "probs": probs}
        full = self.lm_head(final[where])
        greedy = full.argmax(-1)
        if self.drafter.version == 3:
            draft_ids = self.drafter.draft_to_target(
                torch.arange(self.drafter.draft_vocab_size, device=full.device)
            )
            full = full[:, draft_ids]
        return {"index": index, "greedy": greedy, "logits": full}

    def step_loss(
        self, s: int, out: torch.Tensor, final: torch.Tensor, counted_rows: torch.Tensor, teacher: dict
    ) -> tuple[torch.Tensor, Stats]:
        """Step s's loss over the rows t that count a prediction of x_{t+s+2} (``counted_rows``)."""
        R = out.shape[1]
        b, t = counted_rows[:, :R].nonzero(as_tuple=True)
        o, f = out[b, t], final[b, t + s + 1]  # step s at row t predicts the state at t+s+1
        k = teacher["index"][b, t + s + 1]
        greedy = teacher["greedy"][k]
        if self.drafter.version == 3:
            index = self.drafter.t2d.long().cumsum(0) - 1  # target id -> draft id (where t2d)
            counted = self.drafter.t2d[greedy].float()
            labels = torch.where(counted.bool(), index[greedy], -1)
        else:
            counted = torch.ones_like(greedy, dtype=torch.float)
            labels = greedy
        logits = self.drafter.logits(o)
        token = masked_mean(teacher_soft_ce(logits, teacher, k), counted)
        loss = self.cfg.token_loss_weight * token
        keep = counted.bool()  # the step's mean is over these rows, so its stats count them only
        st = head_stats(f"step{s}", token, logits[keep], labels[keep], self.topk)
        if self.cfg.feature_loss_weight > 0:
            feat = masked_mean(feature_regression(o, f), torch.ones_like(counted))
            loss = loss + self.cfg.feature_loss_weight * feat
            rows = feat.new_tensor(float(counted.numel()))
            st.update({f"step{s}/feature_sum": feat.detach() * rows, f"step{s}/feature_n": rows})
        return loss, st

    @torch.no_grad()
    def chains(self, batch: dict, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step s at row t (no noise) against the target's greedy token at t+s+1."""
        inp, final = self.split(self.features(batch))
        greedy = chunked_argmax(self.lm_head, final)
        pos = batch.get("position_ids")
        outs = unroll(self.drafter, inp[:, :-1], batch["input_ids"], depth, pos)
        R = outs[0].shape[1]
        correct, valid = [], []
        for s, out in enumerate(outs):
            pred = self.drafter.draft_to_target(chunked_argmax(self.drafter.logits, out))
            correct.append(pred == shift_left(greedy, s + 1, -1)[:, :R])
            valid.append(label_mask(batch["loss_mask"], s + 2, pos)[:, :R])
        return torch.stack(correct), torch.stack(valid)


def teacher_soft_ce(logits: torch.Tensor, teacher: dict, k: torch.Tensor) -> torch.Tensor:
    """Per row: the soft cross-entropy of ``logits`` against the teacher's distribution at its
    positions ``k`` (the cached top-k soft labels where the cache has them, else the projected logits)."""
    if "probs" in teacher:
        return sparse_soft_cross_entropy(logits, teacher["ids"][k], teacher["probs"][k])
    return soft_cross_entropy(logits, teacher["logits"][k])


def eagle_training(drafter, d: DraftConfig, t: TrainConfig, S: int, element: int, online: bool) -> DraftCost:
    """EAGLE's token loss reads the target's logits, projected online unless they are cached (top-k)."""
    return eagle_cost(drafter, d, S, element, online and t.soft_labels != "topk")
