"""The trainable module a config asks for: the drafter built for the target, its first weights
(from the target and from the training rows), and the objective it trains under.

Everything here happens once, in setup, before the DeepSpeed engine partitions anything:
weights read from the target (its lm_head, its layers) are gathered whole under ZeRO-3.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.layers import depth_problem
from draftheads.heads import DFlashDrafter, Drafter, EagleDrafter, MedusaHeads
from draftheads.heads.dflash.anchor_prior import set_anchor_prior
from draftheads.heads.dflash import choose_mask_token
from draftheads.heads.layer_init import last_layers
from draftheads.heads.target import target_name
from draftheads.heads.target_fingerprint import fingerprint
from draftheads.train.adapters import add_lora
from draftheads.train.engine import gathered
from draftheads.train.modules import (
    DFlashObjective,
    EagleObjective,
    Medusa2Objective,
    MedusaObjective,
    Objective,
)
from draftheads.train.rows import check_mask_choice
from draftheads.train.vocab import draft_vocab, masked_token_counts, vocab_coverage

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def build_drafter(cfg: Config, target: nn.Module, tokenizer: PreTrainedTokenizerBase) -> Drafter:
    """The drafter ``cfg.draft`` describes, for ``target``, attached to it (its shared weights)."""
    fp = fingerprint(target, tokenizer, name=target_name(cfg.target))
    d = cfg.draft
    if d.kind in ("eagle", "dflash") and d.init_from_target:  # refused before anything is built
        last_layers(target, d.num_decoder_layers)
    problem = depth_problem(d.kind, d.version, d.num_decoder_layers, fp.num_layers)
    if problem:
        raise UserError(problem)
    if d.kind == "dflash" and d.mask_token_id is not None:
        check_mask_choice(d.mask_token_id, tokenizer)
    if d.kind == "medusa":
        drafter = MedusaHeads(fp, num_heads=d.num_heads, num_layers=d.num_layers, lm_head=d.lm_head)
    elif d.kind == "dflash":
        drafter = DFlashDrafter(
            fp,
            target_config=target.config.to_dict(),
            mask_token_id=d.mask_token_id if d.mask_token_id is not None else choose_mask_token(tokenizer),
            block_size=d.block_size,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.training_layers(fp.num_layers),
            draft_vocab_size=d.draft_vocab_size,
            layer_config=None if d.kv_heads is None else {"num_key_value_heads": d.kv_heads},
        )
    else:
        drafter = EagleDrafter(
            fp,
            target_config=target.config.to_dict(),
            version=d.version,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.feature_layers,
            draft_vocab_size=d.draft_vocab_size if d.version == 3 else None,
            save_shared=d.save_shared,
            fc_bias=d.fc_bias,
            **d.norm_flags(),
        )
    return drafter.attach(target)


def build_objective(drafter: Drafter, target: nn.Module, d: DraftConfig, topk: int) -> Objective:
    """The module DeepSpeed trains; Medusa-2 (``draft.lora``) first adds LoRA adapters to the
    target and marks the drafter as needing them."""
    if d.kind == "eagle":
        return EagleObjective(drafter, target, d, topk)
    if d.kind == "dflash":
        return DFlashObjective(drafter, target, d, topk)
    if d.lora:
        drafter.requires_adapters = True
        return Medusa2Objective(drafter, add_lora(target, d), d, topk)
    return MedusaObjective(drafter, target, d, topk)


@torch.no_grad()
def init_drafter_weights(
    drafter: Drafter, target: nn.Module, d: DraftConfig, tokens: Sequence[dict], stage: int
) -> dict[str, float]:
    """Weights that come from the target or the data (``tokens``: the training rows' token
    columns), before the engine partitions anything. Returns what the run's data record gains:
    the draft vocabulary's coverage of the answer tokens, where one is chosen."""
    info: dict[str, float] = {}
    lm_head = drafter.shared("lm_head")
    with gathered([lm_head.weight], stage):  # the full weight, even if the target is partitioned
        if isinstance(drafter, MedusaHeads):
            drafter.init_lm_heads_from_target()
        elif (
            isinstance(drafter, DFlashDrafter) and drafter.reduced_vocab
        ):  # its head: the target's rows of these ids
            info["draft_vocab_coverage"] = set_draft_vocab(drafter, tokens)
        elif isinstance(drafter, EagleDrafter) and drafter.version == 3:
            info["draft_vocab_coverage"] = set_draft_vocab(drafter, tokens)
            drafter.init_lm_head_from_target()
    if d.kind in ("eagle", "dflash") and d.init_from_target:
        with gathered(list(target.parameters()), stage):
            drafter.init_from_target(target)
    if isinstance(drafter, DFlashDrafter):  # starting gains, then the prior over them
        if d.qk_gain != 1.0:
            drafter.set_qk_gain(d.qk_gain)
        if d.out_gain != 1.0:
            drafter.set_out_gain(d.out_gain)
        if d.anchor_prior > 0:
            with gathered([drafter.shared("embed").weight], stage):
                set_anchor_prior(drafter, d.anchor_prior, drafter.target_ids())
    return info


def set_draft_vocab(drafter: Drafter, tokens: Sequence[dict]) -> float:
    """The ``draft_vocab_size`` most frequent answer tokens of the training rows as the draft
    vocabulary; returns their share of the answer tokens (rounded to 4 places)."""
    counts = masked_token_counts(tokens, drafter.target_fingerprint.vocab_size)
    ids = draft_vocab(counts, drafter.draft_vocab_size)
    drafter.set_vocab(ids)
    return round(vocab_coverage(counts, ids), 4)
