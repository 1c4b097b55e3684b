"""Medusa-2's LoRA adapters on the target (peft): add them, save them beside the heads, load them.

A Medusa-2 drafter is only valid on the target *with* its adapters, so the checkpoint records
``requires_adapters: true`` and keeps the adapter in ``<checkpoint>/adapter`` (peft's own
``adapter_config.json`` + ``adapter_model.safetensors``). :func:`load_adapters` puts them on a
freshly loaded target through transformers' ``load_adapter``: the model keeps its class, so
fingerprints and the decoder work unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads.checkpoint import ADAPTER_DIR
from draftheads.heads.files import follow_umask


def add_lora(target: nn.Module, cfg: DraftConfig) -> nn.Module:
    """Wrap the (frozen) target in a peft LoRA model; only the adapter weights train."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in target.named_modules()}
    missing = [m for m in cfg.lora_target_modules if m not in present]
    if missing:
        raise UserError(
            f"draft.lora_target_modules: the target has no module named {missing}; "
            f"pick from its linear layers (e.g. q_proj, v_proj)"
        )
    config = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(target, config)


def save_adapters(adapted: nn.Module, checkpoint_dir: str | os.PathLike) -> Path:
    out = Path(checkpoint_dir) / ADAPTER_DIR
    adapted.save_pretrained(str(out))
    follow_umask(out)
    return out


def load_adapters(target: nn.Module, checkpoint_dir: str | os.PathLike) -> nn.Module:
    """Put a Medusa-2 checkpoint's adapters on ``target`` (in place) and return it."""
    path = Path(checkpoint_dir) / ADAPTER_DIR
    if not (path / "adapter_config.json").is_file():
        raise UserError(
            f"{checkpoint_dir} has no {ADAPTER_DIR}/adapter_config.json; it is not a Medusa-2 checkpoint"
        )
    target.load_adapter(str(path))
    target.requires_grad_(False)
    return target.eval()
