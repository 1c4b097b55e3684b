"""A drafter's own rotary embedding, kept in float32 through every cast.

``.to(bfloat16)`` (the decoder casts a drafter to the target's dtype, DeepSpeed's bf16 casts it to
train) would round the rotary frequencies too: a frequency off by up to 2^-9 turns the phase
between positions d apart by up to d * f * 2^-9, so an fp32-trained drafter decoded in bfloat16
would rotate by other angles than it learnt. Computed in float32 they are the reference's
(transformers keeps ``inv_freq`` float32 when it loads a bfloat16 model, vLLM builds its cos/sin
cache in float32).
"""

from __future__ import annotations

from torch import nn


class Float32Rotary:
    """Mixed into a drafter (an ``nn.Module``) whose ``rotary`` is a transformers rotary embedding:
    :meth:`keep_rotary` saves its frequencies, and every ``_apply`` (move or cast) puts them back,
    in float32, on the new device. The copies live outside the module tree, where no cast reaches."""

    rotary: nn.Module

    def keep_rotary(self, rotary: nn.Module) -> None:
        """Make ``rotary`` the drafter's (``self.rotary``; its ``inv_freq`` is not persistent: never saved)."""
        self.rotary = rotary
        self._inv_freq = (rotary.inv_freq.detach().clone(), rotary.original_inv_freq.detach().clone())

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        device = self.rotary.inv_freq.device
        self.rotary.inv_freq, self.rotary.original_inv_freq = (f.to(device) for f in self._inv_freq)
        return self
