"""Training-time test: run an EAGLE drafter for several steps on its own outputs, in one pass per step.

Step 0 sees the target's features. Step s > 0 at row t sees the drafter's own output of step
s-1 at row t (its guess of f_{t+s}) and the token x_{t+s+1}, exactly what it sees when
decoding a chain from position t. Attention follows decoding too: row t of step s attends to
the real-feature keys of rows 0..t (step 0) and to its own keys of steps 1..s at row t, the
"diagonal append" of EAGLE-3 / SpecForge. The keys of every step stay in one cache, so each
step costs one drafter forward over the row.
"""

from __future__ import annotations

import torch

from draftheads.heads.masks import additive_mask, causal, packed_causal
from draftheads.train.objectives import shift_left


def ttt_mask(
    rows: int, step: int, dtype: torch.dtype, device: torch.device, position_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Additive mask ``[B, 1, rows, (step+1)*rows]``: causal over step 0 (within each packed
    document when ``position_ids [B, rows]`` is given; B = 1 otherwise), diagonal over steps 1..step."""
    step0 = causal(rows, device)[None]
    if position_ids is not None:
        step0 = packed_causal(position_ids)
    eye = torch.eye(rows, dtype=torch.bool, device=device).expand(step0.shape[0], -1, -1)
    return additive_mask(torch.cat([step0, *[eye] * step], dim=-1), dtype)


def unroll(
    drafter,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    steps: int,
    position_ids: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Outputs ``[B, T-1, H]`` of ``steps`` drafter steps; ``features`` [B, T-1, F] are f_0..f_{T-2}.

    Row t of step s sits at position t+s and predicts f_{t+s+1} (and so x_{t+s+2}). Packed rows
    (``position_ids``) use per-document positions and attention.
    """
    from transformers import DynamicCache

    B, T = input_ids.shape
    R = T - 1
    hidden = drafter.fuse(features)
    cache = DynamicCache() if steps > 1 else None
    pos = None if position_ids is None else position_ids[:, :R]
    positions = torch.arange(R, device=input_ids.device).expand(B, R) if pos is None else pos
    outs = []
    for s in range(steps):
        ids = shift_left(input_ids, s + 1)[:, :R]
        mask = ttt_mask(R, s, hidden.dtype, hidden.device, pos)
        out = drafter(ids, hidden, positions + s, attention_mask=mask, cache=cache)
        outs.append(out)
        hidden = out
    return outs
