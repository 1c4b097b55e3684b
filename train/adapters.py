"""LoRA adapters on the target (peft), trained with the drafter: add them, save them beside it, load them.

A drafter trained with adapters is only valid on the target *with* them, so the checkpoint records
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
from draftheads.heads.target.layers import decoder_layers

ALL_LINEAR = "all-linear"


def decoder_linears(target: nn.Module) -> list[str]:
    """The full names of every plain ``nn.Linear`` inside the target's decoder layers: Llama's
    q/k/v/o and gate/up/down, Phi-3's fused qkv_proj, DeepSeek's latent projections, an MoE's shared
    experts; not a subclass with its own forward (Llama-4's router returns a tuple LoRA cannot
    wrap), and by full name, so that fused expert weights that share a short name (``down_proj``)
    are not taken for layers."""
    layers = decoder_layers(target)
    prefix = next(name for name, m in target.named_modules() if m is layers)
    return [
        f"{prefix}.{name}"
        for name, m in layers.named_modules()
        if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward
    ]


def add_lora(target: nn.Module, cfg: DraftConfig) -> nn.Module:
    """Wrap the (frozen) target in a peft LoRA model; only the adapter weights train.
    ``draft.<kind>.lora_target_modules=[all-linear]`` (the default) adapts :func:`decoder_linears`."""
    from peft import LoraConfig, get_peft_model

    modules = list(cfg.lora_target_modules)
    if modules == [ALL_LINEAR]:
        modules = decoder_linears(target)
    names = [name for name, _ in target.named_modules()]
    present = {*names, *(name.rsplit(".", 1)[-1] for name in names)}
    missing = [m for m in modules if m not in present]
    if missing or not modules:
        names = sorted({n.rsplit(".", 1)[-1] for n in decoder_linears(target)})
        raise UserError(
            f"draft.{cfg.kind}.lora_target_modules: the target has no module named {missing or modules}; "
            f"pick from its decoder layers' linear layers ({', '.join(names)}) or use [all-linear]"
        )
    config = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(target, config)
    except ValueError as e:
        if "does not work with lora_dropout" not in str(e):
            raise
        raise UserError(
            f"peft adapts this target's fused expert weights ({target.config.model_type}) as parameters, which take "
            f"no dropout; set draft.{cfg.kind}.lora_dropout=0 (it is {cfg.lora_dropout})"
        ) from None


def save_adapters(adapted: nn.Module, checkpoint_dir: str | os.PathLike) -> Path:
    out = Path(checkpoint_dir) / ADAPTER_DIR
    adapted.save_pretrained(str(out))
    follow_umask(out)
    return out


def load_adapters(target: nn.Module, checkpoint_dir: str | os.PathLike) -> nn.Module:
    """Put the adapters of a checkpoint trained with them on ``target`` (in place) and return it."""
    path = Path(checkpoint_dir) / ADAPTER_DIR
    if not (path / "adapter_config.json").is_file():
        raise UserError(
            f"{checkpoint_dir} has no {ADAPTER_DIR}/adapter_config.json; "
            "it was not trained with LoRA adapters on the target"
        )
    target.load_adapter(str(path))
    target.requires_grad_(False)
    return target.eval()
