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

from draftheads.train.objectives import shift_left


def ttt_mask(rows: int, step: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask ``[1, 1, rows, (step+1)*rows]``: causal over step 0, diagonal over steps 1..step."""
    allowed = torch.zeros(rows, (step + 1) * rows, dtype=torch.bool, device=device)
    allowed[:, :rows] = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    eye = torch.eye(rows, dtype=torch.bool, device=device)
    for j in range(1, step + 1):
        allowed[:, j * rows : (j + 1) * rows] = eye
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )
    return mask[None, None]


def unroll(drafter, features: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Outputs ``[B, T-1, H]`` of ``steps`` drafter steps; ``features`` [B, T-1, F] are f_0..f_{T-2}.

    Row t of step s sits at position t+s and predicts f_{t+s+1} (and so x_{t+s+2}).
    """
    from transformers import DynamicCache

    B, T = input_ids.shape
    R = T - 1
    hidden = drafter.fuse(features)
    cache = DynamicCache() if steps > 1 else None
    positions = torch.arange(R, device=input_ids.device).expand(B, R)
    outs = []
    for s in range(steps):
        ids = shift_left(input_ids, s + 1)[:, :R]
        mask = ttt_mask(R, s, hidden.dtype, hidden.device)
        out = drafter(ids, hidden, positions + s, attention_mask=mask, cache=cache)
        outs.append(out)
        hidden = out
    return outs
