"""MTP heads' heads facts: how a config builds the head, the engines that serve it (EAGLE-1's
layout: vLLM's ``eagle`` method, SGLang's ``EAGLE``), its export and its model-card lines (see
:mod:`draftheads.heads.kinds`).

The engines' formats and rules are EAGLE's (:mod:`draftheads.heads.eagle.engine`), declared once
by the EAGLE kind: an export of an MTP head is an EAGLE-1 export and is validated as one. An
exported folder therefore reads back as an EAGLE-1 drafter (the layout names no kind); the
draftheads checkpoint (``save_pretrained``) is the one that reads back as an MTP head.
"""

from __future__ import annotations

from typing import Any

from draftheads.heads.eagle.export import export_eagle1
from draftheads.heads.kinds import DrafterKind, Export
from draftheads.heads.mtp.model import MTPDrafter


class MTPKind(DrafterKind):
    """One decoder layer started as the target's last, drafting recursively through the target's lm_head."""

    name = "mtp"
    drafter = MTPDrafter
    title = "MTP ({num_speculative_steps} steps)"
    any_chain = True  # served as EAGLE-1: the engines draft any chain with it

    def build(self, d, fp, target_config, tokenizer) -> MTPDrafter:
        return MTPDrafter(fp, target_config=target_config, num_speculative_steps=d.num_speculative_steps)

    def num_speculative_tokens(self, conf: dict[str, Any]) -> int:
        """The steps it was trained for (any chain serves, as for EAGLE)."""
        return int(conf["spec"].get("num_speculative_steps", 3))

    def tags(self, conf: dict[str, Any]) -> list[str]:
        return ["multi-token-prediction", "eagle1"]

    def describe(self, conf: dict[str, Any]) -> str:
        return (
            "an MTP head: one decoder layer started as the target's last, run recursively over its own output "
            f"for {self.num_speculative_tokens(conf)} steps through the target's lm_head (served as EAGLE-1)"
        )

    def describe_short(self, conf: dict[str, Any]) -> str:
        return "an MTP head"

    def engine_methods(self, conf: dict[str, Any]) -> list[tuple[str, str]]:
        return [("vllm", "eagle"), ("sglang", "EAGLE")]

    def sglang_refusal(self, conf: dict[str, Any]) -> str | None:
        return None

    def speculators_refusal(self, conf: dict[str, Any]) -> str | None:
        return (
            "speculators' mtp type holds a target's own MTP layer (its enorm, hnorm and eh_proj), not a head "
            "in EAGLE-1's layout; export it with format=vllm or format=sglang"
        )

    def export(self, drafter, engine: str) -> Export:
        """EAGLE-1's layout: fc without a bias (SGLang's gets an exact zero one), layer 0 without input norm."""
        return export_eagle1(drafter, engine)
