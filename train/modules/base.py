"""What every training objective shares: the drafter as the trained submodule, the frozen target
held outside the module tree, and the target features the drafter reads.

Each kind's record names its objective class (``objective``, a dotted path); the recipe builds,
initialises and evaluates through that class (:func:`objective_class`), never by testing the
kind's name. The class methods are the kind's training facts: how to build
the module (:meth:`Objective.build`), the first weights that come from the target or the data
(:meth:`Objective.init_head`, :meth:`Objective.init_rest`), checks of the setup and the rows, the
soft labels it reads from a feature cache, and its held-out evaluation depth and label.

The target sits in a plain dict, so it never reaches the optimizer, a ZeRO partition or a
checkpoint; :meth:`Objective.features` gives its hidden states (computed online, or read from a
feature cache's batch) in the drafter's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.kinds import kind_record
from draftheads.conf.schema.train import TrainConfig
from draftheads.heads import Drafter
from draftheads.heads.features import target_features
from draftheads.train.guards import use_topk


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

    # the held-out metrics' name of a draft step and the number of the first: eval/{name}{k}/...
    eval_label: ClassVar[tuple[str, int]] = ("step", 0)

    @classmethod
    def build(cls, drafter: Drafter, target: nn.Module, d: DraftConfig, topk: int) -> Objective:
        """The module DeepSpeed trains for ``drafter``."""
        return cls(drafter, target, d, topk)

    @classmethod
    def eval_depth(cls, d: DraftConfig) -> int:
        """Draft steps the held-out evaluation checks (at least 1)."""
        return 1

    @classmethod
    def check_setup(cls, d: DraftConfig, tokenizer: Any) -> None:
        """Refuse, before the drafter is built, a config the tokenizer cannot serve."""

    @classmethod
    def check_rows(cls, drafter: Drafter, d: DraftConfig, tokens: Sequence[dict]) -> None:
        """Refuse, before training, training rows (their token columns) this drafter cannot learn from."""

    @classmethod
    def reads_topk(cls, cache: Any, t: TrainConfig, d: DraftConfig) -> bool:
        """Whether training reads the feature cache's top-k logits (refusing what cannot work)."""
        return use_topk(cache, t, d)

    @classmethod
    def init_head(cls, drafter: Drafter, tokens: Sequence[dict]) -> dict[str, float]:
        """The output head's first weights, from the target's (gathered) lm_head and the training
        rows' tokens; returns what the run's data record gains."""
        return {}

    @classmethod
    def init_rest(cls, drafter: Drafter, d: DraftConfig, stage: int) -> None:
        """Further first weights, after the decoder layers (``draft.<kind>.init_from_target``)."""

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


def objective_class(kind: str) -> type[Objective]:
    """The objective its record names for ``kind``; one clear error naming the known kinds otherwise."""
    return kind_record(kind, "draft.kind").objective_class()
