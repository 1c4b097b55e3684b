"""The attention of a P-EAGLE group pass, as pure tensor functions.

Entries are ``(anchor, depth)`` pairs (:mod:`~draftheads.heads.peagle.sampling`): depth 0 at
anchor t is the real pair ``(f_t, x_{t+1})`` at position t; depth d >= 1 is a mask entry at
position t + d. Query ``(a_q, d_q)`` may attend to key ``(a_k, d_k)`` iff both are real entries
of one document and::

    (d_k = 0 and a_k <= a_q)          the context: real pairs up to the anchor
    or (a_k = a_q and d_k <= d_q)     its own group, causally in depth

which is speculators' ``create_peagle_mask_mod`` (``models/peagle/attention.py``) and what a
decoder runs with the accepted positions as context and one group after them. A padding entry
sees only itself, so no softmax row is empty.
"""

from __future__ import annotations

import torch


def group_mask(
    anchor: torch.Tensor, depth: torch.Tensor, keep: torch.Tensor, docs: torch.Tensor
) -> torch.Tensor:
    """Boolean ``[B, N, N]`` (True: may attend) over entries ``anchor``/``depth``/``keep [B, N]``;
    ``docs [B, R]`` is each row's document (all 0 for an unpacked row)."""
    doc = docs.gather(1, anchor)
    aq, ak = anchor[:, :, None], anchor[:, None, :]
    dq, dk = depth[:, :, None], depth[:, None, :]
    context = (dk == 0) & (ak <= aq)
    own = (ak == aq) & (dk <= dq)
    real = keep[:, :, None] & keep[:, None, :] & (doc[:, :, None] == doc[:, None, :])
    eye = torch.eye(anchor.shape[1], dtype=torch.bool, device=anchor.device)
    return (real & (context | own)) | eye


def group_positions(positions: torch.Tensor, anchor: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` rotary positions: the anchor's (per-document) position plus the depth."""
    return positions.gather(1, anchor) + depth


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x [B, R, F]`` at rows ``index [B, N]``: ``[B, N, F]``."""
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


def decode_mask(context: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean ``[B, n + k - 1, S + n + k - 1]`` of a decoding pass: ``n`` new pairs (``valid
    [B, n]`` the real ones), then the ``k - 1`` mask entries of one group anchored at each row's
    last valid pair, over ``context [B, S]`` cached slots, the new pairs and the group.

    A pair sees the context and the valid pairs up to itself; mask entry d sees the context,
    every valid pair (those up to its anchor) and mask entries 1..d."""
    B, n = valid.shape
    m = k - 1
    device = valid.device
    eye = torch.eye(n, dtype=torch.bool, device=device)
    pairs = (torch.ones(n, n, dtype=torch.bool, device=device).tril()[None] & valid[:, None, :]) | eye
    masks = torch.ones(m, m, dtype=torch.bool, device=device).tril()
    top = torch.cat([pairs, pairs.new_zeros(B, n, m)], -1)
    bottom = torch.cat([valid[:, None, :].expand(B, m, n), masks[None].expand(B, m, m)], -1)
    return torch.cat([context[:, None, :].expand(B, n + m, -1), torch.cat([top, bottom], 1)], -1)
