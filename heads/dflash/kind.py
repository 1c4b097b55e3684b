"""DFlash's heads facts: how a config builds the block drafter, its published layouts, the engines'
rules and export, and its model-card lines (see :mod:`draftheads.heads.kinds`)."""

from __future__ import annotations

from typing import Any

from draftheads.heads.dflash import layout
from draftheads.heads.dflash.convert import build_dflash
from draftheads.heads.dflash.engine import DFLASH_FORMATS, DFLASH_RULES
from draftheads.heads.dflash.export import export_dflash, sglang_refusal
from draftheads.heads.dflash.model import DFlashDrafter, mask_token, ordinary_token
from draftheads.heads.dflash.speculators import dflash_engine_config, dflash_to_speculators
from draftheads.heads.kinds import DrafterKind, Export


class DFlashKind(DrafterKind):
    """One non-causal pass over a block of mask tokens drafts ``block_size - 1`` tokens."""

    name = "dflash"
    drafter = DFlashDrafter
    layouts = {"dflash": build_dflash}
    formats = DFLASH_FORMATS
    rules = DFLASH_RULES
    speculators_type = "dflash"
    speculators_engine_layout = "dflash"
    title = "DFlash (block {block_size})"
    layout_hint = layout.HINT

    def detect_files(self, directory, config):
        return layout.detect_files(directory, config)

    def build(self, d, fp, target_config, tokenizer) -> DFlashDrafter:
        """``draft.dflash.mask_token_id``, else the tokenizer's choice (no tokenizer: the last id)."""
        mask = mask_token(d.mask_token_id, tokenizer, fp.vocab_size)
        return DFlashDrafter(
            fp,
            target_config=target_config,
            mask_token_id=mask,
            block_size=d.block_size,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.training_layers(fp.num_layers),
            draft_vocab_size=d.draft_vocab_size,
            layer_config=None if d.kv_heads is None else {"num_key_value_heads": d.kv_heads},
        )

    def num_speculative_tokens(self, conf: dict[str, Any]) -> int:
        """The trained block minus its root: vLLM runs ``1 + num_speculative_tokens`` block positions."""
        return int(conf["spec"]["block_size"]) - 1

    def tags(self, conf: dict[str, Any]) -> list[str]:
        return ["block-diffusion"]

    def describe(self, conf: dict[str, Any]) -> str:
        spec = conf["spec"]
        vocab = spec.get("draft_vocab_size")
        full = vocab is None or vocab == conf.get("target", {}).get("vocab_size")
        return (
            f"a DFlash block drafter: blocks of {spec['block_size']} tokens (the last accepted token, then "
            f"{spec['block_size'] - 1} drafted in one pass), {spec.get('num_decoder_layers', 1)} decoder layer(s), "
            f"mask token {spec['mask_token_id']}, features from layers {spec.get('feature_layers')}, "
            + ("the target's full vocabulary" if full else f"draft vocabulary {vocab}")
        )

    def describe_short(self, conf: dict[str, Any]) -> str:
        return "a DFlash drafter"

    def engine_methods(self, conf: dict[str, Any]) -> list[tuple[str, str]]:
        return [("vllm", "dflash")] + ([] if sglang_refusal(conf) else [("sglang", "DFLASH")])

    def sglang_refusal(self, conf: dict[str, Any]) -> str | None:
        return sglang_refusal(conf)

    def export_refusal(self, conf: dict[str, Any], engine: str) -> str | None:
        return sglang_refusal(conf) if engine == "sglang" else super().export_refusal(conf, engine)

    def export_needs_target(self, conf: dict[str, Any]) -> bool:
        """A reduced vocabulary: the target's lm_head rows of the draft ids are written."""
        vocab = conf["spec"].get("draft_vocab_size")
        return vocab is not None and vocab < conf["target"]["vocab_size"]

    def export(self, drafter, engine: str) -> Export:
        return export_dflash(drafter, engine)

    def to_speculators(self, drafter, section: dict[str, Any]) -> Export:
        return dflash_to_speculators(*export_dflash(drafter, "vllm"), section)

    def engine_config_from_speculators(self, config, layers, where) -> dict[str, Any]:
        return dflash_engine_config(config, layers, where)

    def import_problem(self, spec: dict[str, Any], tokenizer: Any, origin: str) -> str | None:
        """A mask token that text produces, refused as ``draft.dflash.mask_token_id`` is in training."""
        mask = spec["mask_token_id"]
        text = ordinary_token(mask, tokenizer)
        if text is None:
            return None
        key = "mask_token_id" if origin == "speculators" else "dflash_config.mask_token_id"
        return (
            f"{key}={mask} is the ordinary text token {text!r}, which text produces, so the drafter cannot "
            "tell the positions to draft from the text; set it in config.json to the special token the "
            "drafter was trained with, or train one with draftheads (draft=dflash picks a special token)"
        )
