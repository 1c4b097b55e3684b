"""EAGLE's heads facts (EAGLE-1 and EAGLE-3 share it): how a config builds the drafter, its published
layouts, the engines' rules and export, and its model-card lines (see :mod:`draftheads.heads.kinds`)."""

from __future__ import annotations

from typing import Any

from draftheads.heads.eagle import layout
from draftheads.heads.eagle.convert import build_eagle
from draftheads.heads.eagle.engine import EAGLE_FORMATS, EAGLE_RULES
from draftheads.heads.eagle.export import export_eagle1, export_eagle3
from draftheads.heads.eagle.model import EagleDrafter
from draftheads.heads.eagle.speculators import eagle3_engine_config, eagle3_to_speculators
from draftheads.heads.kinds import DrafterKind, Export, speculators_types

EAGLE_SPECULATIVE_TOKENS = 3  # a chain length the engines serve well; any value works for EAGLE


class EagleKind(DrafterKind):
    """One (or a few) decoder layers over target features, drafting autoregressively."""

    name = "eagle"
    drafter = EagleDrafter
    layouts = {"eagle-1": build_eagle, "eagle-3": build_eagle}
    formats = EAGLE_FORMATS
    rules = EAGLE_RULES
    speculators_type = "eagle3"
    speculators_engine_layout = "eagle-3"
    title = "EAGLE-{version}"
    any_chain = True
    layout_hint = layout.HINT

    def classify_keys(self, keys, files) -> str | None:
        return layout.classify_keys(keys, files)

    def build(self, d, fp, target_config, tokenizer) -> EagleDrafter:
        return EagleDrafter(
            fp,
            target_config=target_config,
            version=d.version,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.feature_layers,
            draft_vocab_size=d.draft_vocab_size if d.version == 3 else None,
            save_shared=d.save_shared,
            fc_bias=d.fc_bias,
            **d.section.norm_flags(),
        )

    def num_speculative_tokens(self, conf: dict[str, Any]) -> int:
        """EAGLE drafts autoregressively: any chain length serves."""
        return EAGLE_SPECULATIVE_TOKENS

    def tags(self, conf: dict[str, Any]) -> list[str]:
        return ["eagle3" if conf["spec"].get("version") == 3 else "eagle1"]

    def describe(self, conf: dict[str, Any]) -> str:
        spec = conf["spec"]
        version = spec.get("version", 1)
        layers = spec.get("feature_layers")
        extra = (
            f", draft vocabulary {spec.get('draft_vocab_size')}, features from layers {layers}"
            if version == 3
            else ""
        )
        return f"an EAGLE-{version} drafter with {spec.get('num_decoder_layers', 1)} decoder layer(s){extra}"

    def describe_short(self, conf: dict[str, Any]) -> str:
        return f"an EAGLE-{conf['spec'].get('version', 1)} drafter"

    def engine_methods(self, conf: dict[str, Any]) -> list[tuple[str, str]]:
        v3 = conf["spec"].get("version") == 3
        return [("vllm", "eagle3" if v3 else "eagle"), ("sglang", "EAGLE3" if v3 else "EAGLE")]

    def sglang_refusal(self, conf: dict[str, Any]) -> str | None:
        return None

    def speculators_refusal(self, conf: dict[str, Any]) -> str | None:
        """speculators defines EAGLE-3 only; the refusal names a format that takes this EAGLE-1
        drafter (vLLM drops an fc bias, so one with a bias goes to SGLang)."""
        if conf["spec"].get("version") == 3:
            return None
        works = (
            "export it with format=sglang (vLLM drops its fc bias), or retrain it with draft.eagle.fc_bias=false "
            "for format=vllm"
            if conf["spec"].get("fc_bias", True)
            else "export it with format=vllm or format=sglang"
        )
        return f"speculators has no model type for an EAGLE-1 drafter ({speculators_types()}); " + works

    def export(self, drafter, engine: str) -> Export:
        return export_eagle3(drafter, engine) if drafter.version == 3 else export_eagle1(drafter, engine)

    def to_speculators(self, drafter, section: dict[str, Any]) -> Export:
        return eagle3_to_speculators(*export_eagle3(drafter, "vllm"), section)

    def engine_config_from_speculators(self, config, layers, where) -> dict[str, Any]:
        return eagle3_engine_config(config, layers, where)
