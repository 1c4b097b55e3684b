"""Section ``environment``: what ran the check, and which attention kernel a verify forward uses.

The versions, the device and its TF32 and SDPA flags are printed so that a log names its
setup; the profiler shows whether a 4-D-masked forward (the kind every tree verification runs)
reaches a fused attention kernel or the math fallback.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch

from .log import say

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ATTENTION = r"attention|fmha|flash|sdpa|efficient"  # profiler names of attention ops and kernels


@torch.no_grad()
def environment(target: PreTrainedModel, device: torch.device) -> None:
    """Versions, device, TF32 flags, and the attention kernel one verify forward runs."""
    import transformers

    say(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    if device.type == "cuda":
        say(f"  {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}")
        say(
            f"  tf32 matmul {torch.backends.cuda.matmul.allow_tf32}, sdpa flash "
            f"{torch.backends.cuda.flash_sdp_enabled()}, mem-efficient "
            f"{torch.backends.cuda.mem_efficient_sdp_enabled()}, cudnn {torch.backends.cuda.cudnn_sdp_enabled()}"
        )
    from torch.profiler import ProfilerActivity, profile

    from draftheads.heads.masks import additive_mask

    ids = torch.randint(1, target.config.vocab_size, (1, 16), device=device)
    allowed = torch.ones(16, 16, dtype=torch.bool, device=device).tril()
    mask = additive_mask(allowed[None], next(target.parameters()).dtype)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        target(input_ids=ids, attention_mask=mask, position_ids=torch.arange(16, device=device)[None])
    names = sorted({e.key for e in prof.key_averages() if re.search(ATTENTION, e.key, re.IGNORECASE)})
    say(f"  attention kernels of a 4-D-masked forward: {', '.join(names) or 'none found'}")
