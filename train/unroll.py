"""Training-time test (Li et al., 2025): run a drafter of decoder layers over the target's
features for several steps on its own outputs, in one pass per step.

Step 0 sees the target's features. Step s > 0 at row t sees the drafter's own output of step
s-1 at row t (its guess of f_{t+s}) and the token x_{t+s+1}, exactly what it sees when
decoding a chain from position t. Attention follows decoding too: row t of step s attends to
the real-feature keys of rows 0..t (step 0) and to its own keys of steps 1..s at row t, the
"diagonal append" of Li et al., 2025 and SpecForge. The keys of every step stay in one cache, so
each step costs one drafter forward over the row.

Because nothing but row t itself reads row t's keys and outputs of steps s > 0, a row whose
outputs of steps >= s no loss reads can skip those steps: with ``counted`` (the rows each
step's loss reads), step s > 0 runs only on the rows some step >= s counts (prompt rows and
padding drop out), and the outputs are the same.
"""

from __future__ import annotations

import torch

from draftheads.heads.masks import additive_mask, causal, packed_causal
from draftheads.train.objectives import shift_left


def ttt_allowed(step0: torch.Tensor, cols: list[torch.Tensor]) -> torch.Tensor:
    """Boolean ``[B, n_s, R + n_1 + ... + n_s]`` for step s = len(cols) - 1, whose queries are the
    rows ``cols[s]`` (sorted indices into 0..R-1; ``cols[0]`` is every row): the step-0 keys that
    ``step0 [B, R, R]`` allows (causal, or per packed document), and at each step 1..s only the
    key of the query's own row (the diagonal)."""
    q = cols[-1]
    B = step0.shape[0]
    same_row = [(q[:, None] == c[None, :]).expand(B, -1, -1) for c in cols[1:]]
    return torch.cat([step0[:, q], *same_row], dim=-1)


def live_rows(counted: list[torch.Tensor]) -> list[torch.Tensor]:
    """``live[s] [B, R]``: rows step s must compute, those whose output of step s or a later
    step is counted (row t's step-s output feeds only its own later steps)."""
    live = list(counted)
    for s in range(len(live) - 2, -1, -1):
        live[s] = live[s] | live[s + 1]
    return live


def unroll(
    drafter,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    steps: int,
    position_ids: torch.Tensor | None = None,
    counted: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Outputs ``[B, T-1, H]`` of ``steps`` drafter steps; ``features`` [B, T-1, F] are f_0..f_{T-2}.

    Row t of step s sits at position t+s and predicts f_{t+s+1} (and so x_{t+s+2}). Packed rows
    (``position_ids``) use per-document positions and attention. With ``counted`` (one ``[B, >=
    T-1]`` bool per step: the rows whose output the caller reads), steps after the first run on
    the live rows only (a row live in any batch row is computed for all of them), and outputs
    are 0 elsewhere.
    """
    from transformers import DynamicCache

    B, T = input_ids.shape
    R = T - 1
    device = input_ids.device
    hidden = drafter.fuse(features)
    cache = DynamicCache() if steps > 1 else None
    pos = None if position_ids is None else position_ids[:, :R]
    positions = torch.arange(R, device=device).expand(B, R) if pos is None else pos
    step0 = causal(R, device)[None] if pos is None else packed_causal(pos)
    every = torch.arange(R, device=device)
    live = live_rows([c[:, :R] for c in counted]) if counted is not None else None
    cols: list[torch.Tensor] = []
    outs = []
    for s in range(steps):
        rows = every if s == 0 or live is None else live[s].any(0).nonzero().squeeze(1)
        if s > 0 and rows.numel() < cols[-1].numel():  # the previous step's outputs at these rows
            hidden = hidden[:, torch.searchsorted(cols[-1], rows)]
        cols.append(rows)
        if rows.numel() == 0:  # nothing left to count: this step and later ones read nothing
            outs += [hidden.new_zeros(B, R, hidden.shape[-1])] * (steps - s)
            break
        ids = shift_left(input_ids, s + 1)[:, rows]
        mask = additive_mask(ttt_allowed(step0, cols), hidden.dtype)
        out = drafter(ids, hidden, positions[:, rows] + s, attention_mask=mask, cache=cache)
        full = out if rows.numel() == R else out.new_zeros(B, R, out.shape[-1]).index_copy(1, rows, out)
        outs.append(full)
        hidden = out
    return outs
