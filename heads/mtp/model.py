"""The MTP head: EAGLE-1's drafter with one decoder layer, started as "the target's last layer again".

::

    x_t    = fc(concat(embed(tok_{t+1}), h_t))       # 2H -> H, no bias; starts as [0 | I]: x_t = h_t
    h'_t   = layer(x_t)                              # the target's last layer (no input norm)
    logits = target.lm_head(h'_t)                    # frozen, full vocabulary

``h_t`` is the target's final (normed) hidden state at step 0 and the head's own ``h'`` at the
steps after it (one shared layer for every step, as speculators' MTP and FastMTP run it). That is
:class:`~draftheads.heads.eagle.model.EagleDrafter` at ``version=1`` exactly: the same tensors,
the same first layer without ``input_layernorm`` (vLLM's ``EagleLlamaForCausalLM`` builds layer 0
without one, and our EAGLE-1 export writes none), so the engines serve it as EAGLE-1 and the
decoder drafts it as EAGLE's proposer does. What is its own: the kind it is saved as, the steps
it was trained for (the chain an engine is told to draft), fc's pass-through start, and that it
reads the final state once (no separate regression target: it is trained with the token loss).
"""

from __future__ import annotations

from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.heads.eagle.model import EagleDrafter
from draftheads.heads.target.fingerprint import TargetFingerprint


class MTPDrafter(EagleDrafter):
    """One Llama decoder layer over ``fc(concat(embedding, state))``, drafting through the target's lm_head."""

    kind = "mtp"

    def __init__(
        self,
        target: TargetFingerprint,
        target_config: dict[str, Any],
        layer_config: dict[str, Any] | None = None,
        num_speculative_steps: int = 3,
    ) -> None:
        super().__init__(
            target,
            target_config=target_config,
            version=1,
            layer_config=layer_config,
            num_decoder_layers=1,
            fc_bias=False,
        )
        if num_speculative_steps < 1:
            raise UserError(
                f"draft.mtp.num_speculative_steps={num_speculative_steps} must be at least 1 (the steps an MTP head drafts)"
            )
        self.num_speculative_steps = num_speculative_steps
        with torch.no_grad():
            self.fc.weight.copy_(passthrough_fc(self.fc.weight))

    def spec(self) -> dict[str, Any]:
        """What config.json stores to rebuild the head: its layers and the steps it was trained for."""
        return {
            "target_config": self.target_config,
            "layer_config": self.layer_config_dict(),
            "num_speculative_steps": self.num_speculative_steps,
        }

    def training_layers(self) -> list[int]:
        """The final state alone: the head's input, and through the lm_head its teacher."""
        return self.feature_layers()


def passthrough_fc(weight: torch.Tensor) -> torch.Tensor:
    """fc's first weight ``[0 | I]`` (shape ``[H, 2H]``, the embedding's columns first):
    ``fc(concat(e, h)) = h``, so the untrained head is the target's last layer over its state."""
    H = weight.shape[0]
    eye = torch.eye(H, dtype=weight.dtype, device=weight.device)
    return torch.cat([torch.zeros_like(eye), eye], dim=1)
