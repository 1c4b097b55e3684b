"""Medusa's (and Medusa-2's) draft-config facts."""

from __future__ import annotations

from typing import Any

from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.section import DraftKind

LM_HEAD_MODES = ("shared", "copy")  # Medusa v2 (the target's lm_head) or v1 (a copy per head)


class MedusaDraft(DraftKind):
    name = "medusa"
    keys = (
        "num_heads", "num_layers", "lm_head", "head_loss_weight", "head_loss_decay", "lora", "lora_r",
        "lora_alpha", "lora_dropout", "lora_target_modules", "head_lr_multiplier", "head_warmup",
        "head_warmup_steps", "self_distill_weight",
    )  # fmt: skip
    options = "draft=medusa or draft=medusa2"
    decoder_layers = False
    same_meaning = {"num_decoder_layers": "num_layers"}
    minimums = {"num_heads": 1, "num_layers": 0, "lora_r": 1}
    non_negative = (
        "head_loss_weight",
        "head_loss_decay",
        "self_distill_weight",
        "lora_dropout",
        "head_lr_multiplier",
    )

    def problem(self, d: Any) -> str | None:
        if d.lm_head not in LM_HEAD_MODES:
            return f"draft.lm_head={d.lm_head!r} is unknown; use 'shared' (Medusa v2) or 'copy' (Medusa v1)"
        if d.init_from_target:
            return (
                "draft.init_from_target=true starts EAGLE or DFlash decoder layers as the target's; Medusa "
                "heads have none (their lm_heads start from the target's already); use draft.init_from_target=false"
            )
        return None


KIND = KindRecord(
    name="medusa",
    section=MedusaDraft(),
    groups=("medusa", "medusa2"),
    drafter="draftheads.heads.medusa.kind:MedusaKind",
    objective="draftheads.train.modules.medusa:MedusaObjective",
    small={"medusa": ("draft.num_heads=2",), "medusa2": ("draft.num_heads=2",)},
    proposer="draftheads.decode.proposers.medusa:MedusaProposer",
    bench=(
        BenchDrafter(
            "medusa",
            "medusa",
            ("draft=medusa",),
            "1e-3",
            reads="last",
            offline=False,
            steps="medusa_steps",
            tokens="medusa_tokens",
            tree=True,
            default=True,
        ),
    ),
)
