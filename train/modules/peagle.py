"""The P-EAGLE objective: every row's parallel group at once, its depths sampled by conditional drop.

Row t of a batch row (the pair ``(f_t, x_{t+1})``) anchors a group whose depth d predicts
x_{t+d+2} (:mod:`draftheads.heads.peagle.model`). One drafter pass computes depth 0 at every row
and, at depth d >= 1, the anchors that conditional drop keeps (:mod:`~draftheads.heads.peagle.
sampling`); the loss is one mean over every counted entry, all depths pooled::

    L = sum_{(t, d) kept, counted} KL(p_{t+d+1} || q_{t,d}) / #counted

p = softmax of the target's logits at t+d+1 over the draft vocabulary (or its cached top-k,
renormalised), q = the drafter's. An entry counts when x_{t+d+2} is an answer token of t's
document (:func:`~draftheads.train.objectives.label_mask`). This is speculators'
``PEagleDraftModel`` loss (its default ``kl_div``, no depth decay), with one difference of
alignment: speculators counts the entry by the mask of x_{t+d+1} (its shifted batch's
``loss_mask``), draftheads by the token it predicts, as the EAGLE objective does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.masks import document_ids
from draftheads.heads.peagle.from_eagle3 import check_matches, eagle3_checkpoint, start_from_eagle3
from draftheads.heads.peagle.sampling import DropSampling, conditional_drop, every_depth, group_entries
from draftheads.train.engine import gathered
from draftheads.train.modules.base import chunked_argmax
from draftheads.train.modules.costs import DraftCost
from draftheads.train.modules.dflash_checks import cached_topk, check_mask_choice, check_mask_token
from draftheads.train.modules.eagle import EagleObjective, eagle_cost
from draftheads.train.objectives import (
    Stats,
    head_stats,
    kl_to_teacher,
    label_mask,
    masked_mean,
    sparse_soft_cross_entropy,
    uniform_noise,
)

Entries = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # anchor, depth, keep: each [B, N]


def counted_depths(
    loss_mask: torch.Tensor, depths: int, rows: int, position_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """``[depths, B, rows]``: depth d at anchor t counts (x_{t+d+2} is an answer token of t's document)."""
    return torch.stack([label_mask(loss_mask, d + 2, position_ids)[:, :rows] for d in range(depths)])


def sparse_kl(logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Per row: KL(p || q) for a teacher p zero outside ``ids`` (probabilities ``probs``):
    the sparse cross-entropy minus the teacher's entropy."""
    return sparse_soft_cross_entropy(logits, ids, probs) + torch.special.xlogy(probs, probs).sum(-1)


def check_depths(depths: int, rows: Sequence[dict]) -> None:
    """Refuse a group deeper than every row's answer: depth d trains where x_{t+d+2} is an answer
    token, so depths past the longest answer never train (and cost a pass each)."""
    most = max((int(sum(r["loss_mask"])) for r in rows), default=0)
    if depths > most:
        raise UserError(
            f"draft.peagle.num_depths={depths} is more than the longest answer in the training rows ({most} tokens); "
            f"use at most {most} (speculators trains groups of 8)"
        )


def group_queries(d, S: int) -> float:
    """Group entries per row token that conditional drop keeps (rows taken full, every token an
    answer): depth 0 at every row, depth d >= 1 at ``max(ratio**d, ratio_min)`` of the seeds
    (``max_anchors`` of the S rows at most)."""
    seeds = 1.0 if d.max_anchors is None else min(1.0, d.max_anchors / S)
    deeper = sum(max(d.down_sample_ratio**k, d.down_sample_ratio_min) for k in range(1, d.num_depths))
    return 1.0 + seeds * deeper


def peagle_cost(drafter, d, t, S: int, element: int, online: bool) -> DraftCost:
    """EAGLE-3's cost with one pass of the layers and the head per kept group entry (the dry run's sizing)."""
    return eagle_cost(drafter, d, S, element, online and t.soft_labels != "topk", group_queries(d, S))


class PEagleObjective(EagleObjective):
    """P-EAGLE's loss (module docstring), with EAGLE-3's feature split, teacher, draft vocabulary
    and lm_head start; the mask token's embedding (or the whole table) starts as the target's."""

    eval_label = ("depth", 0)

    @classmethod
    def build(cls, drafter, target, d, topk: int) -> PEagleObjective:
        sampling = DropSampling(d.down_sample_ratio, d.down_sample_ratio_min, d.max_anchors)
        return cls(drafter, target, d, topk, sampling)

    @classmethod
    def eval_depth(cls, d) -> int:
        """Every depth of the group."""
        return d.num_depths

    @classmethod
    def check_setup(cls, d, tokenizer: Any) -> None:
        if d.mask_token_id is not None:
            check_mask_choice(d.mask_token_id, tokenizer, d.kind)

    @classmethod
    def check_rows(cls, drafter, d, tokens: Sequence[dict]) -> None:
        check_mask_token(drafter.mask_token_id, tokens, drafter.kind)
        check_depths(drafter.num_depths, tokens)
        if d.init_from_eagle3 is not None:  # refused before the run changes its folder
            _, cfg = eagle3_checkpoint(d.init_from_eagle3)
            check_matches(
                cfg,
                drafter.spec(),
                drafter.target_fingerprint,
                f"draft.peagle.init_from_eagle3={d.init_from_eagle3}",
            )

    @classmethod
    def reads_topk(cls, cache: Any, t, d) -> bool:
        """The cache's top-k logits unless ``train.soft_labels=full`` (then projected, as EAGLE-3)."""
        return t.soft_labels != "full" and cached_topk(cache, t)

    @classmethod
    def init_rest(cls, drafter, d, stage: int) -> None:
        """The mask token's embedding (with ``own_embedding``, the whole table) as the target's;
        with ``draft.peagle.init_from_eagle3``, every other tensor as that EAGLE-3 drafter's."""
        with gathered([drafter.shared("embed").weight], stage):
            drafter.init_embedding_from_target()
        if d.init_from_eagle3 is not None:
            with gathered(list(drafter.parameters()), stage):
                start_from_eagle3(drafter, d.init_from_eagle3)

    def __init__(self, drafter, target, cfg, topk: int, sampling: DropSampling | None = None) -> None:
        super().__init__(drafter, target, cfg, topk)
        self.sampling = sampling or DropSampling()

    def inputs(self, batch: dict, noise: float = 0.0) -> dict[str, torch.Tensor]:
        """The group pass's row inputs: features f_0..f_{R-1} (R = T - 1), the next tokens,
        positions and documents, and the final states (the teacher's input)."""
        inp, final = self.split(self.features(batch))
        ids, pos = batch["input_ids"], batch.get("position_ids")
        R = ids.shape[1] - 1
        positions = torch.arange(R, device=ids.device).expand(ids.shape[0], R) if pos is None else pos[:, :R]
        docs = torch.zeros_like(positions) if pos is None else document_ids(pos)[:, :R]
        return {
            "features": uniform_noise(inp[:, :R], noise),
            "next_ids": ids[:, 1:],
            "positions": positions,
            "docs": docs,
            "final": final,
        }

    def sample(self, batch: dict, generator: torch.Generator | None = None) -> Entries:
        """The training entries: conditional drop over the counted anchors of every depth."""
        R = batch["input_ids"].shape[1] - 1
        counted = counted_depths(batch["loss_mask"], self.drafter.num_depths, R, batch.get("position_ids"))
        return group_entries(conditional_drop(counted, self.sampling, generator))

    def forward(self, batch: dict, step: int = 0) -> tuple[torch.Tensor, Stats]:
        return self.loss(batch, self.sample(batch))

    def loss(self, batch: dict, entries: Entries) -> tuple[torch.Tensor, Stats]:
        """The pooled KL over ``entries`` (anchor, depth, keep ``[B, N]``) that count."""
        x = self.inputs(batch, self.cfg.feature_noise)
        teacher = self.teacher(
            x["final"], batch["loss_mask"], batch.get("topk_ids"), batch.get("topk_logits")
        )
        anchor, depth, keep = entries
        out = self.drafter.group(x["features"], x["next_ids"], x["positions"], x["docs"], *entries)
        R = x["next_ids"].shape[1]
        counted = counted_depths(batch["loss_mask"], self.drafter.num_depths, R, batch.get("position_ids"))
        b = torch.arange(anchor.shape[0], device=anchor.device)[:, None].expand_as(anchor)
        rows = keep & counted[depth, b, anchor]
        bi, i = rows.nonzero(as_tuple=True)
        k = teacher["index"][bi, anchor[bi, i] + depth[bi, i] + 1]  # the target's state at t + d + 1
        logits = self.drafter.logits(out[bi, i])
        if "probs" in teacher:  # cached top-k soft labels
            kl = sparse_kl(logits, teacher["ids"][k], teacher["probs"][k])
        else:
            kl = kl_to_teacher(logits, teacher["logits"][k])
        total = masked_mean(kl, torch.ones_like(kl))
        return total, self.depth_stats(kl, logits, teacher["greedy"][k], depth[bi, i])

    def depth_stats(
        self, kl: torch.Tensor, logits: torch.Tensor, greedy: torch.Tensor, depth: torch.Tensor
    ) -> Stats:
        """Per depth: the mean KL and the top-1/top-k hits of the target's greedy token where the
        draft vocabulary holds it (``depth{d}/...``)."""
        index = self.drafter.t2d.long().cumsum(0) - 1  # target id -> draft id (where t2d)
        inside = self.drafter.t2d[greedy]
        stats: Stats = {}
        for d in range(self.drafter.num_depths):
            at = depth == d
            loss = masked_mean(kl.detach(), at.float())
            keep = at & inside
            st = head_stats(f"depth{d}", loss, logits[keep], index[greedy[keep]], self.topk)
            rows = loss.new_tensor(float(at.sum()))
            st.update({f"depth{d}/loss_sum": loss * rows, f"depth{d}/loss_n": rows})
            stats.update(st)
        return stats

    @torch.no_grad()
    def chains(self, batch: dict, depth: int, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth d of the group at row t (every anchor, no drop, no noise) against the target's
        greedy token at t+d+1: ``(correct, valid)`` each ``[depth, B, R]``. Anchors go ``chunk``
        at a time, each pass with the whole row as context."""
        x = self.inputs(batch)
        greedy = chunked_argmax(self.lm_head, x["final"])
        B, R = x["next_ids"].shape
        pos = batch.get("position_ids")
        valid = counted_depths(batch["loss_mask"], depth, R, pos)
        correct = torch.zeros_like(valid)
        cols = torch.arange(R, device=greedy.device)
        for start in range(0, R, chunk):
            rows = ((cols >= start) & (cols < start + chunk)).expand(B, R)
            anchor, dep, keep = group_entries(every_depth(rows, depth))
            out = self.drafter.group(
                x["features"], x["next_ids"], x["positions"], x["docs"], anchor, dep, keep
            )
            pred = self.drafter.draft_to_target(chunked_argmax(self.drafter.logits, out))
            want = greedy.gather(1, (anchor + dep + 1).clamp(max=greedy.shape[1] - 1))
            b = torch.arange(B, device=greedy.device)[:, None].expand_as(anchor)
            correct[dep[keep], b[keep], anchor[keep]] = (pred == want)[keep]
        return correct, valid
