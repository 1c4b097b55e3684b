"""Medusa's heads facts: how a config builds the heads, their published layouts, vLLM's rules and
export, and their model-card lines (see :mod:`draftheads.heads.kinds`)."""

from __future__ import annotations

from typing import Any

from draftheads.heads.kinds import DrafterKind, Export
from draftheads.heads.medusa import layout
from draftheads.heads.medusa.convert import build_medusa
from draftheads.heads.medusa.engine import MEDUSA_FORMATS, MEDUSA_RULES
from draftheads.heads.medusa.export import export_medusa
from draftheads.heads.medusa.model import MedusaHeads


class MedusaKind(DrafterKind):
    """n residual MLP heads over the target's last hidden state (Medusa-1, and Medusa-2 with LoRA)."""

    name = "medusa"
    drafter = MedusaHeads
    layouts = {"medusa-v1": build_medusa, "medusa-v2": build_medusa, "medusa-2": build_medusa}
    formats = MEDUSA_FORMATS
    rules = MEDUSA_RULES
    title = "Medusa ({num_heads} heads)"
    layout_hint = layout.HINT

    def detect_files(self, directory, config):
        return layout.detect_files(directory, config)

    def classify_keys(self, keys, files) -> str | None:
        return layout.classify_keys(keys, files)

    def build(self, d, fp, target_config, tokenizer) -> MedusaHeads:
        return MedusaHeads(fp, num_heads=d.num_heads, num_layers=d.num_layers, lm_head=d.lm_head)

    def num_speculative_tokens(self, conf: dict[str, Any]) -> int:
        """Exactly the head count. vLLM copies the value into the number of heads it builds
        (``num_lookahead_tokens``) and drops unknown keys, so a smaller value serves fewer heads and
        a larger one builds heads with no weights."""
        return int(conf["spec"]["num_heads"])

    def tags(self, conf: dict[str, Any]) -> list[str]:
        if conf["spec"].get("lm_head") == "copy":
            return ["medusa-1"]
        return ["medusa-2" if conf.get("requires_adapters") else "medusa"]

    def describe(self, conf: dict[str, Any]) -> str:
        spec = conf["spec"]
        lm = "own lm_heads" if spec.get("lm_head") == "copy" else "the target's shared lm_head"
        variant = (
            "Medusa-2 (trained jointly with LoRA adapters on the target)"
            if conf.get("requires_adapters")
            else "Medusa-1"
        )
        return f"{variant} heads: {spec['num_heads']} heads × {spec['num_layers']} ResBlock(s), with {lm}"

    def describe_short(self, conf: dict[str, Any]) -> str:
        return "Medusa heads"

    def engine_methods(self, conf: dict[str, Any]) -> list[tuple[str, str]]:
        return [("vllm", "medusa")]

    def sglang_refusal(self, conf: dict[str, Any]) -> str | None:
        return "SGLang does not support Medusa heads; use vLLM or the draftheads decoder."

    def export_needs_target(self, conf: dict[str, Any]) -> bool:
        """Shared-lm_head heads: the target's lm_head is written."""
        return conf["spec"].get("lm_head") == "shared"

    def export(self, drafter, engine: str) -> Export:
        return export_medusa(drafter, engine)
