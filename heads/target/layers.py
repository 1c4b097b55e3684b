"""The target's stack of decoder layers, found by name across the supported architectures."""

from __future__ import annotations

from torch import nn

from draftheads.conf.errors import UserError


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's stack of decoder layers (``model.layers`` or GPT-2's ``transformer.h``)."""
    base = model.base_model if hasattr(model, "base_model") else model
    for attr in ("layers", "h", "blocks"):
        layers = getattr(base, attr, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise UserError(
        f"cannot find the decoder layers of {type(model).__name__}; it is not a supported decoder-only LM"
    )
