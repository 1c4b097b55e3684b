"""Medusa's (and Medusa-2's) draft-config facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.section import DraftKind, section_keys

LM_HEAD_MODES = ("shared", "copy")  # Medusa v2 (the target's lm_head) or v1 (a copy per head)
HEAD_WARMUPS = ("sine", "linear", "constant")  # Medusa-2's head learning-rate warm-up


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
    minimums = {"num_heads": 1, "num_layers": 0, "lora_r": 1, "head_warmup_steps": 0}
    non_negative = (
        "head_loss_weight",
        "head_loss_decay",
        "self_distill_weight",
        "lora_dropout",
        "head_lr_multiplier",
    )

    def problem(self, d: Any) -> str | None:
        if d.lm_head not in LM_HEAD_MODES:
            return f"draft.medusa.lm_head={d.lm_head!r} is unknown; use 'shared' (Medusa v2) or 'copy' (Medusa v1)"
        if d.head_warmup not in HEAD_WARMUPS:
            return (
                f"draft.medusa.head_warmup={d.head_warmup} is not valid; use one of {', '.join(HEAD_WARMUPS)}"
            )
        if not 0 < d.head_loss_decay <= 1:
            return f"draft.medusa.head_loss_decay={d.head_loss_decay} must be in (0, 1]"
        if d.lora and not d.lora_target_modules:
            return "draft.medusa.lora_target_modules is empty; list the target's linear layers to adapt"
        return None

    def train_problem(self, d: Any, t: Any) -> str | None:
        if d.lora and t.features == "offline":
            return (
                "draft=medusa2 trains LoRA adapters on the target, so its features change every step; "
                "use train.features=online"
            )
        return None


KIND = KindRecord(
    name="medusa",
    section=MedusaDraft(),
    groups=("medusa", "medusa2"),
    drafter="draftheads.heads.medusa.kind:MedusaKind",
    objective="draftheads.train.modules.medusa:MedusaObjective",
    small={"medusa": ("draft.medusa.num_heads=2",), "medusa2": ("draft.medusa.num_heads=2",)},
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
