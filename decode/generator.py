"""SpeculativeGenerator: a frozen target and a drafter, made ready to decode together.

Construction checks that the target can take a tree attention mask, places the drafter with
the target's lm_head, picks the backends by measurement and builds the drafter's tree; it also
measures (once per set-up, cached) the verify-cost model the planner reads, so that no call
pauses to measure. A call then runs in three phases, each in its
own module and mixed into the class:

* stream.py (:class:`Streaming`): ``generate`` and ``stream``, the call's settings and checks,
  the phases in order, its stats;
* prefill.py (:class:`Prefilling`): the prompts read into the cache, the first new token, the
  call's ``State``;
* step.py (:class:`Stepping`): the draft-verify step, and the rows that finished leaving the
  batch;

and capture.py (:class:`Capturing`) makes the CUDA graphs of ``decode.backend=cuda-graphs``
before a call. The target and the drafter run on ``decode.backend`` (backend.py) while a call
is in progress.
"""

from __future__ import annotations

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import backend as backends
from draftheads.decode import backend_choice
from draftheads.decode.capture import Capturing
from draftheads.decode.context import position_limit
from draftheads.decode.cost import CostCurve, CostModel
from draftheads.decode.cost_cache import cached_model
from draftheads.decode.planner import Planner
from draftheads.decode.prefill import Prefilling, Sampling
from draftheads.decode.proposers import build_proposer
from draftheads.decode.proposers.base import Proposer
from draftheads.decode.stats import DecodeStats
from draftheads.decode.step import Stepping
from draftheads.decode.stream import Streaming
from draftheads.decode.tree import drafter_tree
from draftheads.heads.masks import recurrent_kinds

MASKABLE_ATTENTION = ("sdpa", "eager")

__all__ = ["DecodeStats", "SpeculativeGenerator"]


class SpeculativeGenerator(Streaming, Capturing, Prefilling, Stepping):
    """Speculative decoding of a frozen Hugging Face causal LM with a draftheads drafter.

    ``generate`` returns what ``target.generate`` returns (prompt + new tokens, right-padded with
    the pad id per row); greedy output is the target's own greedy output, sampling follows the
    target's (temperature, top-k, top-p warped) distribution exactly, except with
    ``config.typical=True`` (the typical acceptance of Cai et al., 2024: faster, not lossless).

    ``drafter`` is a drafter of any kind (MedusaHeads, EagleDrafter, DFlashDrafter), or None
    for lookup decoding alone (prompt lookup branches, no model). The drafter is moved to the device and dtype of the target's
    lm_head (a sharded target's last device; oneDNN packs none of the layers it offloads). Its
    tree is ``config.tree``: ``auto`` (``tree.json`` beside the heads when the drafter was
    loaded from a directory that has one, else a default; with ``config.dynamic``, a drafter that
    drafts trees as it goes builds its own: dynamic trees (Li et al., 2024) or DDTree),
    ``chain``/``chainN``, a JSON choices list, or a tree.json path.
    """

    def __init__(
        self,
        target: nn.Module,
        drafter: nn.Module | None = None,
        tokenizer=None,
        config: DecodeConfig | None = None,
        tree_dir: str | None = None,
    ) -> None:
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.config = config or DecodeConfig()
        impl = getattr(target.config, "_attn_implementation", None) or "eager"
        if impl not in MASKABLE_ATTENTION:
            raise UserError(
                f"the target's attention implementation {impl!r} cannot take a tree attention mask; "
                f"load it with attn_implementation='sdpa' (or 'eager')"
            )
        # layers with a recurrent state (Qwen3.5's linear attention): one row, each step's leading chain
        self.recurrent = recurrent_kinds(target.config)
        # the drafter sits with the lm_head (a sharded target's outputs come back where its inputs are)
        head = target.get_output_embeddings().weight
        self.device, self.dtype = head.device, head.dtype
        self.backend = backends.resolve(self.config.backend, self.device, self.dtype)
        # packed weights kept from call to call (checked unchanged at each); ``packs.clear()`` frees them
        self.packs = backends.PackCache()
        if self.backend == "cuda-graphs" and self.recurrent:
            raise UserError(
                f"decode.backend=cuda-graphs captures attention-only targets; this one has {self.recurrent[0]} "
                "layers: use decode.backend=auto"
            )
        if self.backend == "cuda-graphs" and hasattr(target, "_hf_hook"):
            raise UserError(
                "decode.backend=cuda-graphs cannot capture a target that accelerate spreads or offloads "
                "(target.device_map); use decode.backend=auto"
            )
        if drafter is None and not self.config.lookup:
            raise UserError("nothing to draft with: give a drafter (heads=DIR) or turn on decode.lookup=true")
        if drafter is not None:
            drafter.to(device=self.device, dtype=self.dtype)
            drafter.eval()
        self.choices = self._choose_backends()
        self.static = (
            drafter_tree(drafter, self.config, tree_dir, self.device) if drafter is not None else None
        )
        # measured here, once per set-up (announced), so that no call pauses to measure
        self.cost_model: CostModel | None = (
            cached_model(target, self.backend, self.config.cost_cache) if self.config.cost_aware else None
        )
        self.limit = position_limit(target.config)
        self.last_stats = DecodeStats()
        # what the last call of each acceptance setting learned: the next one's priors (last_planner)
        self.planners: dict[tuple, Planner] = {}
        self.setting: tuple = ("greedy", "exact")  # this call's (or the last call's) acceptance setting

    @property
    def last_planner(self) -> Planner | None:
        """What the last call with this call's acceptance setting (greedy, or sampling at its
        temperature and warpers, and typical acceptance or not) learned, carried into this call's
        planner: acceptance under greedy says little about acceptance at temperature 1, so each
        setting starts from its own measurements, never from another's."""
        return self.planners.get(self.setting)

    @last_planner.setter
    def last_planner(self, planner: Planner | None) -> None:
        if planner is None:
            self.planners.pop(self.setting, None)
        else:
            self.planners[self.setting] = planner

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor | None, how: Sampling, *args, **kwargs):
        """:meth:`Prefilling.prefill`, after taking the call's acceptance setting from ``how`` (the
        key of :attr:`last_planner`, read once the prompts are in)."""
        self.setting = (*how.processing.setting, "typical" if how.typical else "exact")
        return super().prefill(input_ids, mask, how, *args, **kwargs)

    def make_proposer(self) -> Proposer:
        """A fresh proposer for one call: the drafter's (or lookup alone), with lookup branches."""
        return build_proposer(self.drafter, self.static, self.config)

    def cost_curve(self, batch: int = 1, context: int = 1) -> CostCurve:
        """The verify-cost curve of this device, target and backend for ``batch`` rows after
        ``context`` cached tokens, from the model measured at construction (read from the cache,
        or measured then when ``decode.cost_aware`` was off)."""
        if self.cost_model is None:
            self.cost_model = cached_model(self.target, self.backend, self.config.cost_cache)
        return self.cost_model.curve(batch, context)

    def backend_lines(self) -> list[str]:
        """One line per part saying which backend runs it and what each candidate's call cost."""
        return [c.line() for c in self.choices]

    def _drafter_modules(self) -> list[nn.Module]:
        if self.drafter is None:
            return []
        return [self.drafter, *getattr(self.drafter, "runtime_modules", list)()]  # a reduced draft head, say

    def _choose_backends(self) -> list[backend_choice.Choice]:
        """Set ``backend`` and ``drafter_backend`` by measurement (decode/backend_choice.py)."""
        self.drafter_layers = backend_choice.own_layers(self._drafter_modules(), self.target)
        picked = backend_choice.pick(
            self.config.backend,
            self.backend,
            self.target,
            self.drafter_layers,
            self.config.cost_cache,
            self.packs,
        )
        self.backend, self.drafter_backend, choices = picked
        return choices

    def _run_backend(self) -> backends.Backend:
        """This call's backend over the target and the drafter (packed weights, checked)."""
        return backend_choice.run_backend(self, self._drafter_modules())
