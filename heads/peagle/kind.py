"""P-EAGLE's heads facts: how a config builds the drafter, speculators' ``peagle`` layout (the one
published layout, read and written), the engines it is served by, and its model-card lines (see
:mod:`draftheads.heads.kinds`).

vLLM serves P-EAGLE from speculators' layout (``vllm serve DIR``: the ``peagle`` config turns
on its parallel drafting); it has no engine layout of its own, so ``format=vllm`` and
``format=sglang`` are refused naming ``format=speculators``.
"""

from __future__ import annotations

from typing import Any

from draftheads.conf.errors import UserError
from draftheads.heads.dflash.model import mask_token
from draftheads.heads.kinds import DrafterKind, Export
from draftheads.heads.peagle.convert import build_peagle, speculators_model
from draftheads.heads.peagle.model import PEagleDrafter

ONLY_SPECULATORS = (
    "a P-EAGLE drafter is served from speculators' peagle layout (vLLM's parallel drafting reads it); "
    "export it with format=speculators"
)


class PEagleKind(DrafterKind):
    """EAGLE-3's drafter with a mask token: one pass drafts ``num_depths`` tokens."""

    name = "peagle"
    drafter = PEagleDrafter
    layouts = {"peagle": build_peagle}  # speculators' own layout, under its speculators_model_type
    speculators_type = "peagle"
    title = "P-EAGLE ({num_depths} per pass)"

    def build(self, d, fp, target_config, tokenizer) -> PEagleDrafter:
        """``draft.peagle.mask_token_id``, else the tokenizer's choice (no tokenizer: the last id), as DFlash."""
        mask = mask_token(d.mask_token_id, tokenizer, fp.vocab_size)
        return PEagleDrafter(
            fp,
            target_config=target_config,
            mask_token_id=mask,
            num_depths=d.num_depths,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.feature_layers,
            draft_vocab_size=d.draft_vocab_size,
            own_embedding=d.own_embedding,
            **d.section.norm_flags(),
        )

    def num_speculative_tokens(self, conf: dict[str, Any]) -> int:
        """The trained group: one pass drafts ``num_depths`` tokens."""
        return int(conf["spec"]["num_depths"])

    def tags(self, conf: dict[str, Any]) -> list[str]:
        return ["eagle3", "parallel-drafting"]

    def describe(self, conf: dict[str, Any]) -> str:
        spec = conf["spec"]
        embedding = "its own input embedding" if spec.get("own_embedding") else "the target's embedding"
        return (
            f"a P-EAGLE drafter: EAGLE-3 with {spec.get('num_decoder_layers', 1)} decoder layer(s) drafting "
            f"{spec['num_depths']} tokens in one pass (mask token {spec['mask_token_id']}, {embedding}), "
            f"draft vocabulary {spec.get('draft_vocab_size')}, features from layers {spec.get('feature_layers')}"
        )

    def describe_short(self, conf: dict[str, Any]) -> str:
        return "a P-EAGLE drafter"

    def engine_methods(self, conf: dict[str, Any]) -> list[tuple[str, str]]:
        return [("vllm", "eagle3")]

    def sglang_refusal(self, conf: dict[str, Any]) -> str | None:
        return f"SGLang does not serve parallel drafting; {ONLY_SPECULATORS}"

    def export_refusal(self, conf: dict[str, Any], engine: str) -> str | None:
        if engine in ("vllm", "sglang"):
            return f"format={engine}: {ONLY_SPECULATORS}"
        return super().export_refusal(conf, engine)

    def export_needs_target(self, conf: dict[str, Any]) -> bool:
        """The speculators layout holds a whole input embedding: the target's with the drafter's
        mask row, unless the drafter keeps its own copy (``own_embedding``)."""
        return not conf["spec"].get("own_embedding")

    def export(self, drafter, engine: str) -> Export:
        """Refused: the engines read P-EAGLE from speculators' layout only."""
        raise UserError(f"format={engine}: {ONLY_SPECULATORS}")

    def to_speculators(self, drafter, section: dict[str, Any]) -> Export:
        return speculators_model(drafter, section)
