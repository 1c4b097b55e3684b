"""The module DeepSpeed trains: a drafter plus its objective, ``forward(batch, step) -> (loss, stats)``.

One class per objective family (Medusa, Medusa-2, EAGLE, DFlash). The frozen target is held in a plain dict, outside the module
tree, so it never reaches the optimizer, a ZeRO partition or a checkpoint. Medusa-2 is the
exception: its LoRA-adapted target *is* a submodule (the adapters train), and only the
adapter parameters require gradients.

Besides the training loss, each class gives ``chains(batch)``: per draft step (DFlash: per
block position), whether the drafter's top-1 equals the target's greedy token along a top-1
chain. The recipe turns that into held-out accuracies and a simulated acceptance length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads.features import packed_inputs, target_features
from draftheads.train.objectives import (
    Stats,
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
    feature_regression,
    head_stats,
    head_warmup,
    kl_to_teacher,
    label_mask,
    masked_mean,
    medusa_loss,
    sample_anchors,
    shift_left,
    soft_cross_entropy,
    sparse_soft_cross_entropy,
    token_uniforms,
    topk_teacher,
    uniform_noise,
)
from draftheads.train.unroll import unroll


def chunked_argmax(fn, h: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """argmax(fn(h), -1) over the leading dims of ``h`` without holding all logits at once."""
    flat = h.reshape(-1, h.shape[-1])
    out = torch.cat([fn(flat[i : i + chunk]).argmax(-1) for i in range(0, flat.shape[0], chunk)])
    return out.reshape(h.shape[:-1])


class Objective(nn.Module):
    def __init__(self, drafter, target: nn.Module, cfg: DraftConfig, topk: int) -> None:
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


class MedusaObjective(Objective):
    """Medusa-1: heads on a frozen target (see :func:`medusa_loss`)."""

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

    def __init__(self, drafter, adapted: nn.Module, cfg: DraftConfig, topk: int) -> None:
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


class EagleObjective(Objective):
    """EAGLE-1 and EAGLE-3, one loss with the version's defaults:

    L = sum_{s < steps} decay**s * [ w_f * SmoothL1(f'_s, f_{t+s+1}) + w_t * softCE(q_s, p_{t+s+1}) ]

    p = softmax of the target's logits at the target position; q = the drafter's. EAGLE-1:
    one step, full vocabulary through the frozen lm_head, uniform feature noise on the input.
    EAGLE-3: ``draft.ttt_steps`` steps, its own lm_head over the draft vocabulary, p restricted
    to that vocabulary, and positions whose target top-1 falls outside it not counted.
    """

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
        if "probs" in teacher:  # cached top-k soft labels
            ce = sparse_soft_cross_entropy(logits, teacher["ids"][k], teacher["probs"][k])
        else:
            ce = soft_cross_entropy(logits, teacher["logits"][k])
        token = masked_mean(ce, counted)
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


class DFlashObjective(Objective):
    """DFlash: blocks anchored at random answer positions, every block of a micro-batch drafted
    in one drafter pass (the context keys and values computed once per row):

    L = sum w_k * CE(q_{a,k}, y_{a+k}) / sum w_k   over the counted positions k >= 1 of every block,
    w_k = exp(-(k-1) / gamma)

    y is the data's next token, or the target's top-k at a+k-1 when the feature cache holds it
    (renormalised over the draft vocabulary). A position counts when its reference token (the
    data token, or the target's top-1) is in the draft vocabulary, as EAGLE-3's do.
    """

    # evaluation drafts every answer position's block, this many per row and pass
    EVAL_ANCHORS = 64
    # training drafts its sampled blocks this many per row and pass (the default 8 or 32: one pass)
    TRAIN_ANCHORS = 64

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

    def draft(self, batch: dict, context: list, anchors: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The drafter's output states ``[B, N, block, H]`` of the blocks at ``anchors``, one pass."""
        d, bs = self.drafter, self.drafter.block_size
        docs, valid, pos = self.geometry(batch)
        out = d(
            block_inputs(batch["input_ids"], anchors, bs, d.mask_token_id),
            block_positions(anchors, bs, pos),
            context,
            block_mask(anchors, keep, bs, docs, valid)[:, None],
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
        """The decayed block loss over the sampled anchors (``draft.anchors_per_row``; 0: every
        answer position). The blocks go through the drafter :attr:`TRAIN_ANCHORS` per row at a
        time over one context pass: a block never sees another, so the chunks' losses add up to
        one pass's, and the attention over other blocks' rows stays bounded."""
        docs, valid, pos = self.geometry(batch)
        candidates = anchor_candidates(batch["loss_mask"], pos)
        per_doc = self.cfg.anchors_per_row or candidates.shape[1]
        anchors, keep = sample_anchors(candidates, docs, per_doc, token_uniforms(valid))
        context = self.context(self.features(batch), pos)
        total, weight, stats, counted_rows = None, None, {}, 0
        for c in range(0, anchors.shape[1], self.TRAIN_ANCHORS):
            part = (anchors[:, c : c + self.TRAIN_ANCHORS], keep[:, c : c + self.TRAIN_ANCHORS])
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
        self, batch: dict, context: list, anchors: torch.Tensor, keep: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Stats, int]:
        """The blocks at ``anchors``: (sum of w_k CE, sum of w_k, summed stats, counted rows)."""
        d, bs = self.drafter, self.drafter.block_size
        h = self.draft(batch, context, anchors, keep)
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
        weight = block_decay(bs, self.cfg.loss_gamma, ce.device)[k] * in_vocab
        stats = self.position_stats(ce, logits, labels, k, in_vocab)
        correct = torch.zeros_like(counted)
        correct[b, n, k] = d.draft_to_target(logits.argmax(-1)) == reference
        tau = block_acceptance(correct, counted)[counted[..., 1]].double()
        stats.update({"block/tau_sum": tau.sum(), "block/n": tau.new_tensor(float(tau.numel()))})
        return (ce * weight).sum(), weight.sum(), stats, b.numel()

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
