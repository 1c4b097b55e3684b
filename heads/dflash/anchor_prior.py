"""A DFlash drafter's first layer started so that its block rows read their anchor token
(``draft.dflash.anchor_prior``).

A block row k >= 1 starts from the constant mask embedding: the anchor token x_a reaches it only
through attention, shared with hundreds of context keys. At the usual start every key is about
equally likely, so the anchor row gets ~1/(C + B) of the attention and of the gradient that
would teach the layer to read it, and a small run never learns the bigram x_a -> x_{a+1} that
EAGLE-3's layer has in its own row. This sets the first layer's weights (not its shape: the
checkpoint, the exports and the engines' loaders are unchanged) so that every block row's
query meets the anchor row's key with a logit ``boost`` nats above the context's and the mask
rows', in one rotary dimension pair that barely turns over a context's length:

    w       = argmin |X w - 1|^2 + l|w|^2,  w . m = 0    X: the normed token embeddings, m: the mask's
    k_i(y)  = s_k w . y      ~ s_k on a token row, 0 on a mask row
    q_i(y)  = s_q m . y / |m|^2  = s_q on a mask row
    fc      <- (I - u u^T) fc,  u = w * hidden_norm / |.|   so k_i = 0 on every context row
    logit   = g^2 q^_i k^_i / sqrt(D) = boost       (q^, k^: the q/k norms' unit-RMS heads)

with ``i = D/2 - 1`` (the slowest rotary frequency) and ``s`` twice a projection row's norm,
so that dimension i is twice as large as a random one before the q/k norms; the norms' gains
``g`` at i make the boost. Everything stays trainable: the run decides how much to keep.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from draftheads.heads.dflash import DFlashDrafter

# dimension i's raw size against a random dimension's, before the q/k norms
SCALE = 2.0


def anchor_direction(x: torch.Tensor, mask: torch.Tensor, ridge: float = 1e-3) -> torch.Tensor:
    """``w [H]`` with ``x @ w ~ 1`` on the token rows ``x [N, H]`` and ``w . mask = 0`` exactly:
    ridge least squares in the complement of ``mask``."""
    m = mask / mask.norm()
    xp = x - (x @ m)[:, None] * m  # project every row into the complement of the mask
    gram = xp.T @ xp
    gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    w = torch.linalg.solve(gram, xp.T @ torch.ones(x.shape[0], dtype=x.dtype))
    return w - (w @ m) * m


def prior_gain(boost: float, head_dim: int) -> float:
    """The q/k norm gain at dimension i that makes the logit ``boost``: a head whose dimension i
    is SCALE times the others' RMS normalises it to ``SCALE sqrt(D / (D + SCALE^2 - 1))``."""
    unit = SCALE * math.sqrt(head_dim / (head_dim + SCALE**2 - 1))
    return math.sqrt(boost * math.sqrt(head_dim)) / unit


@torch.no_grad()
def set_anchor_prior(drafter: DFlashDrafter, boost: float, token_ids: torch.Tensor) -> None:
    """Start ``drafter``'s first layer so its block rows attend to their anchor row with a logit
    ``boost`` nats above the other keys (see the module). ``token_ids`` are the tokens an anchor
    can be (the draft vocabulary); the fit runs in float64 on the CPU."""
    layer = drafter.layers[0]
    attn = layer.self_attn
    D, i = attn.head_dim, attn.head_dim // 2 - 1
    embed = drafter.shared("embed").weight
    norm = layer.input_layernorm
    x = norm(embed[token_ids.to(embed.device)].float()).double().cpu()
    mask = norm(embed[drafter.mask_token_id].float()).double().cpu()
    w = anchor_direction(x, mask)

    fc = drafter.fc.weight
    u = w * drafter.hidden_norm.weight.double().cpu()
    u = (u / u.norm()).to(fc.device, fc.dtype)
    fc.sub_(torch.outer(u, u @ fc))  # no context state has a component along w any more

    def set_rows(proj: torch.nn.Linear, heads: int, row: torch.Tensor) -> None:
        scale = SCALE * proj.weight.float().norm(dim=1).pow(2).mean().sqrt()  # before any is set
        for h in range(heads):
            proj.weight[h * D + i] = (scale * row).to(proj.weight)
            if proj.bias is not None:
                proj.bias[h * D + i] = 0

    set_rows(attn.k_proj, attn.kv_heads, w.float().to(embed.device))
    set_rows(attn.q_proj, attn.heads, (mask / mask.pow(2).sum()).float().to(embed.device))
    gain = prior_gain(boost, D)
    attn.q_norm.weight[i] = gain
    attn.k_norm.weight[i] = gain
