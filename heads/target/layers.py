"""The target's stack of decoder layers, found by name across the supported architectures."""

from __future__ import annotations

from torch import nn

from draftheads.conf.errors import UserError

STACK_NAMES = ("layers", "h", "blocks")  # Llama-likes, GPT-2, others


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's stack of decoder layers: the outermost ``ModuleList`` named ``layers`` (or
    GPT-2's ``h``, ``blocks``), however deep the text model is nested (``model.layers``,
    ``transformer.h``, Llama-4's ``model.language_model.layers``)."""
    found = [
        (name.count("."), name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in STACK_NAMES and len(module)
    ]
    if not found:
        raise UserError(
            f"cannot find the decoder layers of {type(model).__name__} (no 'layers' list of modules); "
            "draftheads drafts for decoder-only causal LMs"
        )
    return min(found, key=lambda f: f[0])[2]
