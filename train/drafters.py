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
from draftheads.conf.schema.kinds import depth_problem
from draftheads.heads import Drafter, drafter_kind
from draftheads.heads.layer_init import last_layers
from draftheads.heads.target.fingerprint import fingerprint
from draftheads.heads.target.load import target_name
from draftheads.train.engine import gathered
from draftheads.train.modules import Objective, objective_class

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def build_drafter(cfg: Config, target: nn.Module, tokenizer: PreTrainedTokenizerBase) -> Drafter:
    """The drafter ``cfg.draft`` describes, for ``target``, attached to it (its shared weights)."""
    fp = fingerprint(target, tokenizer, name=target_name(cfg.target))
    d = cfg.draft
    # refused before anything is built (only the sections of kinds with decoder layers have the key)
    if getattr(d.section, "init_from_target", False):
        last_layers(target, d.num_decoder_layers, d.kind)
    problem = depth_problem(d, fp.num_layers)
    if problem:
        raise UserError(problem)
    objective_class(d.kind).check_setup(d, tokenizer)
    drafter = drafter_kind(d.kind).build(d, fp, target.config.to_dict(), tokenizer)
    return drafter.attach(target)


def build_objective(drafter: Drafter, target: nn.Module, d: DraftConfig, topk: int) -> Objective:
    """The module DeepSpeed trains, as the objective of the kind's record builds it (an objective
    that adapts the target, as LoRA does, puts its adapters on it first and marks the drafter as needing them)."""
    return objective_class(d.kind).build(drafter, target, d, topk)


@torch.no_grad()
def init_drafter_weights(
    drafter: Drafter, target: nn.Module, d: DraftConfig, tokens: Sequence[dict], stage: int
) -> dict[str, float]:
    """Weights that come from the target or the data (``tokens``: the training rows' token
    columns), before the engine partitions anything. Returns what the run's data record gains:
    the draft vocabulary's coverage of the answer tokens, where one is chosen."""
    objective = objective_class(d.kind)
    lm_head = drafter.shared("lm_head")
    with gathered([lm_head.weight], stage):  # the full weight, even if the target is partitioned
        info = objective.init_head(drafter, tokens)
    if getattr(d.section, "init_from_target", False):
        with gathered(list(target.parameters()), stage):
            drafter.init_from_target(target)
    objective.init_rest(drafter, d, stage)
    return info
