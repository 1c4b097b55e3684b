"""Medusa's (and Medusa-2's) draft-config facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.section import DraftKind, section_keys

LM_HEAD_MODES = ("shared", "copy")  # Medusa v2 (the target's lm_head) or v1 (a copy per head)


@dataclass
class MedusaSection:
    """Medusa's draft.* keys (Medusa-1, and Medusa-2 with LoRA on the target)."""

    num_heads: int = 4
    num_layers: int = 1
    lm_head: str = "shared"
    # Medusa-1 loss: sum_k weight * decay**k * CE_k
    head_loss_weight: float = 1.0
    head_loss_decay: float = 0.8
    # --- Medusa-2: LoRA on the target, trained jointly ---
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    # ["all-linear"]: every plain linear layer of the target's decoder layers, whatever their names
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    head_lr_multiplier: float = 4.0
    head_warmup: str = "sine"
    head_warmup_steps: int = 100
    self_distill_weight: float = 1.0


class MedusaDraft(DraftKind):
    name = "medusa"
    schema = MedusaSection
    keys = section_keys(MedusaSection)
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
