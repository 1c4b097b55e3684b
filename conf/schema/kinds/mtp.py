"""MTP heads' draft-config facts: their keys and checks, the target layer they read, their record.

An MTP head (multi-token prediction, as speculators' MTP fine-tuning and FastMTP train it) is
one decoder layer started as the target's last, fed ``fc(concat(embed(x_{t+1}), h_t))`` with
``h_t`` the target's final state (later steps: its own previous output), predicting through the
target's frozen lm_head. It is trained for ``num_speculative_steps`` recursive steps with the
token loss alone, step k weighted by FastMTP's normalised exponential decay (arXiv:2509.18362,
eq. 2)::

    alpha_k = beta**k / sum_{j < K} beta**j        (beta = step_weight_decay, K = num_speculative_steps)

It is served in EAGLE-1's layout (vLLM's ``eagle`` method), so it reads the final state only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.section import DraftKind, section_keys


@dataclass
class MTPSection:
    """MTP heads' draft.* keys."""

    # one decoder layer, run recursively for every step (the engines' EAGLE-1 layout holds one)
    num_decoder_layers: int = 1
    # start the layer as the target's last (that is an MTP head; false, a randomly initialised
    # layer, is an ablation)
    init_from_target: bool = True
    # K: the steps trained, step k predicting the token k + 1 further ahead than the target does
    num_speculative_steps: int = 3
    # beta of the step weights alpha_k = beta**k / sum_j beta**j (FastMTP's 0.6)
    step_weight_decay: float = 0.6


class MTPDraft(DraftKind):
    name = "mtp"
    schema = MTPSection
    keys = section_keys(MTPSection)
    options = "draft=mtp"
    same_meaning = {
        "num_layers": "num_decoder_layers",
        "ttt_steps": "num_speculative_steps",
        "num_depths": "num_speculative_steps",
        "ttt_decay": "step_weight_decay",
    }
    minimums = {"num_decoder_layers": 1, "num_speculative_steps": 1}

    def problem(self, d: Any) -> str | None:
        if d.num_decoder_layers != 1:
            return (
                f"draft.mtp.num_decoder_layers={d.num_decoder_layers}: an MTP head is one decoder layer run "
                "recursively; use draft.mtp.num_decoder_layers=1 (and draft.mtp.num_speculative_steps for more steps)"
            )
        if not 0 < d.step_weight_decay <= 1:
            return (
                f"draft.mtp.step_weight_decay={d.step_weight_decay} must be in (0, 1] (step k weighs "
                "beta**k / sum_j beta**j); use e.g. 0.6 (FastMTP's)"
            )
        return None

    def training_layers(self, d: Any, num_layers: int) -> list[int]:
        """The final state: the head's input and, through the target's lm_head, its teacher."""
        return [num_layers]

    def topk_labels(self, d: Any) -> str:
        """Its token loss learns the target's distribution, from the cached top-k where there is one."""
        return "learns"

    def serving_note(self, d: Any) -> str | None:
        return (
            "vLLM and SGLang serve an MTP head as an EAGLE-1 drafter (method eagle / EAGLE), any chain length"
        )


KIND = KindRecord(
    name="mtp",
    section=MTPDraft(),
    groups=("mtp",),
    drafter="draftheads.heads.mtp.kind:MTPKind",
    objective="draftheads.train.modules.mtp:MTPObjective",
    cost="draftheads.train.modules.mtp:mtp_training",
    # a chain of its trained steps, drafted as EAGLE's proposer drafts EAGLE-1's
    proposer="draftheads.decode.proposers.eagle:EagleProposer",
    small={"mtp": ("draft.mtp.num_speculative_steps=2",)},
    # trained in memory on the final state (EAGLE-1's recipe); not in the default bench.drafters
    bench=(BenchDrafter("mtp", "mtp", ("draft=mtp",), "5e-4", reads="last"),),
)
