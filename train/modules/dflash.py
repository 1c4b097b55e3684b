"""The DFlash objective: blocks anchored at random answer positions, every block of a micro-batch
drafted in one drafter pass over context keys and values computed once per row, with a
position-decayed loss; evaluation drafts a block at every answer position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.train import TrainConfig
from draftheads.heads.dflash.anchor_prior import set_anchor_prior
from draftheads.heads.features import target_features
from draftheads.train.engine import gathered
from draftheads.train.modules.base import Objective, chunked_argmax
from draftheads.train.modules.costs import DraftCost, attention_widths, count, layer_activation
from draftheads.train.modules.dflash_blocks import (
    anchor_candidates,
    block_acceptance,
    block_decay,
    block_inputs,
    block_mask,
    block_positions,
    block_targets,
    chunked_anchors,
    dflash_train_flops,
    documents,
    dpace_weights,
    sample_anchors,
    token_uniforms,
)
from draftheads.train.modules.dflash_checks import (
    cached_topk,
    check_anchor_count,
    check_block_size,
    check_mask_choice,
    check_mask_token,
)
from draftheads.train.objectives import (
    Stats,
    head_stats,
    label_mask,
    shift_left,
    sparse_soft_cross_entropy,
    topk_teacher,
)
from draftheads.train.vocab import set_draft_vocab

if TYPE_CHECKING:
    from draftheads.heads.dflash import DFlashDrafter


def blind_blocks(
    shape: torch.Size, dropout: float, device: torch.device, blind: bool = False
) -> torch.Tensor | None:
    """``[B, N]`` True where a training block sees the context: none when ``blind``, else each
    is hidden from it with probability ``dropout``, drawn from the global CPU torch RNG (saved
    in checkpoints, so a resumed run draws what an uninterrupted one would); None (no draw) at 0."""
    if blind:
        return torch.zeros(shape, dtype=torch.bool, device=device)
    if dropout <= 0:
        return None
    return (torch.rand(shape, dtype=torch.float64) >= dropout).to(device)


def dflash_cost(drafter: DFlashDrafter, d: DraftConfig, S: int, element: int) -> DraftCost:
    """DFlash: the context keys/values of every row token, then ``anchors x block`` query tokens
    per row through the layers and the frozen head.

    flops = 6 (fc + 2 H KV n) + q (6 layers + 12 n (S/2 + b) A + 4 H Vd),  q = anchors b / S
    """
    H, b = drafter.target_fingerprint.hidden_size, d.block_size
    A, KV = attention_widths(drafter.layer_config)
    n = len(drafter.layers)
    q = d.anchors_per_row * b / S if d.anchors_per_row else b  # 0: a block at every position (at most)
    context = count(drafter.fc) + 2 * H * KV * n
    query = 6 * count(drafter.layers) + 12 * n * (S / 2 + b) * A + 4 * H * drafter.draft_vocab_size
    flops = 6 * context + q * query
    per_query = n * layer_activation(drafter.layer_config, element) + 8 * drafter.draft_vocab_size
    activation = q * per_query + element * (drafter.fc.in_features + H + 2 * KV * n)
    return DraftCost(flops, activation)


class DFlashObjective(Objective):
    """DFlash: blocks anchored at random answer positions, every block of a micro-batch drafted
    in one drafter pass (the context keys and values computed once per row):

    L = sum w_k * CE(q_{a,k}, y_{a+k}) / sum w_k   over the counted positions k >= 1 of every block,
    w_k = exp(-(k-1) / gamma)   (``draft.dflash.position_weights=dpace``: per block, :func:`dpace_weights`)

    y is the data's next token, or the target's top-k at a+k-1 when the feature cache holds it
    (renormalised over the draft vocabulary). A position counts when its reference token (the
    data token, or the target's top-1) is in the draft vocabulary, as EAGLE-3's do.
    """

    # evaluation drafts every answer position's block, this many per row and pass
    EVAL_ANCHORS = 64
    # training drafts its sampled blocks this many per row and pass (the default 8 or 32: one pass)
    TRAIN_ANCHORS = 64
    eval_label = ("pos", 1)

    @classmethod
    def eval_depth(cls, d) -> int:
        """Block positions 1 .. block-1."""
        return d.block_size - 1

    @classmethod
    def check_setup(cls, d, tokenizer: Any) -> None:
        if d.mask_token_id is not None:
            check_mask_choice(d.mask_token_id, tokenizer, d.kind)

    @classmethod
    def check_rows(cls, drafter, d, tokens: Sequence[dict]) -> None:
        check_mask_token(drafter.mask_token_id, tokens, drafter.kind)
        check_anchor_count(d.anchors_per_row, tokens)
        check_block_size(d.block_size, tokens)

    @classmethod
    def reads_topk(cls, cache: Any, t, d) -> bool:
        return cached_topk(cache, t)

    @classmethod
    def init_head(cls, drafter, tokens: Sequence[dict]) -> dict[str, float]:
        """A reduced vocabulary: its head is the target's rows of these ids."""
        if not drafter.reduced_vocab:
            return {}
        return {"draft_vocab_coverage": set_draft_vocab(drafter, tokens)}

    @classmethod
    def init_rest(cls, drafter, d, stage: int) -> None:
        """The starting gains, then the prior over them."""
        if d.qk_gain != 1.0:
            drafter.set_qk_gain(d.qk_gain)
        if d.out_gain != 1.0:
            drafter.set_out_gain(d.out_gain)
        if d.anchor_prior > 0:
            with gathered([drafter.shared("embed").weight], stage):
                set_anchor_prior(drafter, d.anchor_prior, drafter.target_ids())

    def geometry(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(document ids, real-token mask, position ids or None) of the micro-batch's rows."""
        valid = batch["attention_mask"].bool()
        pos = batch.get("position_ids")
        return documents(valid, pos), valid, pos

    def context(self, feats: torch.Tensor, pos: torch.Tensor | None) -> list:
        """Every drafter layer's context keys and values over the whole rows (once per micro-batch)."""
        B, T = feats.shape[:2]
        positions = torch.arange(T, device=feats.device).expand(B, T) if pos is None else pos
        return self.drafter.context_kv(feats, positions)

    def draft(
        self,
        batch: dict,
        context: list,
        anchors: torch.Tensor,
        keep: torch.Tensor,
        sees_context: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The drafter's output states ``[B, N, block, H]`` of the blocks at ``anchors``, one pass
        (blocks whose ``sees_context`` is False read their own rows only)."""
        d, bs = self.drafter, self.drafter.block_size
        docs, valid, pos = self.geometry(batch)
        out = d(
            block_inputs(batch["input_ids"], anchors, bs, d.mask_token_id),
            block_positions(anchors, bs, pos),
            context,
            block_mask(anchors, keep, bs, docs, valid, sees_context)[:, None],
        )
        return out.view(*anchors.shape, bs, -1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The draft head's logits, the states cast to its (the target's) dtype: a bfloat16
        target meets an fp32 drafter, or the reverse, here."""
        head = self.drafter.head()
        return head(h.to(head.weight.dtype))

    def next_tokens(self, batch: dict) -> torch.Tensor:
        """``[B, T]`` the reference next token at each position: the target's cached top-1 when
        the batch carries top-k logits, else the data's own next token."""
        if "topk_ids" in batch:
            return batch["topk_ids"][..., 0].long()
        return shift_left(batch["input_ids"], 1)

    def forward(self, batch: dict, step: int = 0) -> tuple[torch.Tensor, Stats]:
        """The decayed block loss over the sampled anchors (``draft.dflash.anchors_per_row``; 0: every
        answer position). The blocks go through the drafter :attr:`TRAIN_ANCHORS` per row at a
        time over one context pass: a block never sees another, so the chunks' losses add up to
        one pass's, and the attention over other blocks' rows stays bounded."""
        docs, valid, pos = self.geometry(batch)
        candidates = anchor_candidates(batch["loss_mask"], pos)
        per_doc = self.cfg.anchors_per_row or candidates.shape[1]
        anchors, keep = sample_anchors(candidates, docs, per_doc, token_uniforms(valid))
        blind = step < self.cfg.blind_steps
        sees = blind_blocks(anchors.shape, self.cfg.context_dropout, anchors.device, blind)
        context = self.context(self.features(batch), pos)
        total, weight, stats, counted_rows = None, None, {}, 0
        for c in range(0, anchors.shape[1], self.TRAIN_ANCHORS):
            chunk = slice(c, c + self.TRAIN_ANCHORS)
            part = (anchors[:, chunk], keep[:, chunk], None if sees is None else sees[:, chunk])
            loss_sum, w, chunk_stats, n = self.block_loss(batch, context, *part)
            total = loss_sum if total is None else total + loss_sum
            weight = w if weight is None else weight + w
            stats = {k: stats[k] + v if k in stats else v for k, v in chunk_stats.items()}
            counted_rows += n
        B, N = anchors.shape
        gflop = self.flops(B, batch["input_ids"].shape[1], N, counted_rows) / 1e9
        stats.update({"cost/gflop_sum": total.new_tensor(gflop).double(), "cost/n": valid.sum().double()})
        return total / weight.clamp(min=1), stats

    def block_loss(
        self,
        batch: dict,
        context: list,
        anchors: torch.Tensor,
        keep: torch.Tensor,
        sees_context: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, Stats, int]:
        """The blocks at ``anchors``: (sum of w_k CE, sum of w_k, summed stats, counted rows)."""
        d, bs = self.drafter, self.drafter.block_size
        h = self.draft(batch, context, anchors, keep, sees_context)
        source, counted = block_targets(anchors, keep, bs, batch["loss_mask"], batch.get("position_ids"))
        b, n, k = counted.nonzero(as_tuple=True)
        src = source[b, n, k]
        reference = self.next_tokens(batch)[b, src]
        logits = self.logits(h[b, n, k]).float()
        in_vocab = d.t2d[reference]
        labels = torch.where(in_vocab, d.t2d.long().cumsum(0)[reference] - 1, 0)
        if "topk_ids" in batch:  # the target's top-k at a+k-1 as soft labels
            ids, probs = topk_teacher(batch["topk_ids"][b, src], batch["topk_logits"][b, src], d.t2d)
            ce = sparse_soft_cross_entropy(logits, ids, probs)
        else:
            ce = F.cross_entropy(logits, labels, reduction="none")
        weight = self.position_weights(logits, labels, in_vocab, (b, n, k), counted) * in_vocab
        stats = self.position_stats(ce, logits, labels, k, in_vocab)
        correct = torch.zeros_like(counted)
        correct[b, n, k] = d.draft_to_target(logits.argmax(-1)) == reference
        tau = block_acceptance(correct, counted)[counted[..., 1]].double()
        stats.update({"block/tau_sum": tau.sum(), "block/n": tau.new_tensor(float(tau.numel()))})
        return (ce * weight).sum(), weight.sum(), stats, b.numel()

    def position_weights(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        in_vocab: torch.Tensor,
        where: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        counted: torch.Tensor,
    ) -> torch.Tensor:
        """The loss weight of each counted row (at ``where`` in the ``[B, N, block]`` grid):
        ``exp(-(k-1)/gamma)``, or with ``draft.dflash.position_weights=dpace`` the gradient of the
        block's expected accepted length (:func:`dpace_weights`), position k's acceptance taken
        as the draft's probability of the target's greedy token (0 outside the draft vocabulary)."""
        b, n, k = where
        if self.cfg.position_weights == "decay":
            return block_decay(self.drafter.block_size, self.cfg.loss_gamma, logits.device)[k]
        with torch.no_grad():
            picked = logits.gather(-1, labels[:, None])[:, 0] - logits.logsumexp(-1)
            accept = torch.zeros(counted.shape, dtype=logits.dtype, device=logits.device)
            accept[b, n, k] = picked.exp() * in_vocab
            return dpace_weights(accept, counted, self.cfg.dpace_alpha)[b, n, k]

    def flops(self, batch_rows: int, T: int, anchors: int, counted: int) -> float:
        """Matmul FLOPs of a micro-batch of ``batch_rows`` rows of ``T`` positions with ``anchors``
        blocks each (:func:`dflash_train_flops`); logged per real row token as ``cost/gflop``."""
        d, bs = self.drafter, self.drafter.block_size
        return dflash_train_flops(
            d.layer_shape,
            d.target_fingerprint.hidden_size,
            len(d.feature_layers()),
            d.num_decoder_layers,
            d.draft_vocab_size,
            rows=batch_rows * T,
            blocks=batch_rows * anchors * bs,
            keys=T + anchors * bs,
            counted=counted,
        )

    def position_stats(
        self,
        ce: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        k: torch.Tensor,
        counted: torch.Tensor,
    ) -> Stats:
        """Per block position: mean loss and top-1/top-k over its counted rows."""
        stats: Stats = {}
        for pos in range(1, self.drafter.block_size):
            rows = (k == pos) & counted
            loss = ce[rows].mean() if rows.any() else ce.new_zeros(())
            stats.update(head_stats(f"pos{pos}", loss, logits[rows], labels[rows], self.topk))
        return stats

    @torch.no_grad()
    def chains(self, batch: dict, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every answer position's block (anchors in passes of :attr:`EVAL_ANCHORS` per row):
        ``correct, valid [min(depth, block-1), blocks]``, position k's top-1 against the target's
        greedy token at a+k-1 (the target's own argmax when it runs here, its cached top-1, or
        the data's next token)."""
        d, bs = self.drafter, self.drafter.block_size
        docs, valid, pos = self.geometry(batch)
        feats, reference = self.features_and_greedy(batch)
        context = self.context(feats, pos)
        correct, counted = [], []
        for anchors, keep in chunked_anchors(anchor_candidates(batch["loss_mask"], pos), self.EVAL_ANCHORS):
            h = self.draft(batch, context, anchors, keep)
            source, valid_k = block_targets(anchors, keep, bs, batch["loss_mask"], pos)
            pred = d.draft_to_target(chunked_argmax(self.logits, h))
            hit = pred == reference.gather(1, source.flatten(1)).view_as(source)
            correct.append(hit[keep])
            counted.append(valid_k[keep])
        steps = min(depth, bs - 1)
        return torch.cat(correct)[:, 1 : steps + 1].T, torch.cat(counted)[:, 1 : steps + 1].T

    def features_and_greedy(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(the drafter's features, ``[B, T]`` the target's greedy next token at each position).

        Online, the target runs once for both (its logits only where a next token is an answer
        token); from a cache, :meth:`next_tokens`."""
        if "features" in batch:
            return self.features(batch), self.next_tokens(batch)
        pos = batch.get("position_ids")
        where = label_mask(batch["loss_mask"], 1, pos)
        f, logits = target_features(
            self.target,
            batch["input_ids"],
            batch["attention_mask"],
            self.layers(),
            position_ids=pos,
            logits_at=where,
        )
        greedy = shift_left(batch["input_ids"], 1)
        greedy[where] = logits.argmax(-1)
        return f.to(self.dtype), greedy


def dflash_training(drafter, d: DraftConfig, t: TrainConfig, S: int, element: int, online: bool) -> DraftCost:
    """DFlash learns from the data's tokens (or cached top-k): no target logits."""
    return dflash_cost(drafter, d, S, element)
