"""Medusa heads: n independent residual MLP heads over the target's last hidden state.

Head k (0-based) reads the final hidden state h_t and predicts token t+k+2 (the target's own
lm_head predicts t+1). A head is m ResBlocks, each ``x + SiLU(W x + b)`` with W zero-initialised
so that a fresh head starts as the identity, followed by an lm_head:

* ``lm_head="copy"`` (Medusa "v1"): each head owns a copy of the target's lm_head, trained;
* ``lm_head="shared"`` (Medusa "v2"): the target's own lm_head, shared and frozen.

Every ResBlock has its own weights (the reference code's ``[ResBlock(H)] * n`` shares one).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.base import Drafter
from draftheads.heads.target.fingerprint import TargetFingerprint


class ResBlock(nn.Module):
    """x + SiLU(W x + b), with W = 0 at init so the block starts as the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(Drafter):
    kind = "medusa"
    dynamic_trees = False  # a static tree over the heads' top candidates

    def tree_width(self) -> int | None:
        return self.num_heads

    def __init__(
        self, target: TargetFingerprint, num_heads: int = 4, num_layers: int = 1, lm_head: str = "shared"
    ) -> None:
        super().__init__(target)
        if num_heads < 1 or num_layers < 0:
            raise UserError(
                f"draft.medusa.num_heads={num_heads}, draft.medusa.num_layers={num_layers}: need at least 1 head and 0 layers"
            )
        if lm_head not in ("shared", "copy"):
            raise UserError(
                f"draft.medusa.lm_head={lm_head!r} is not valid; use 'shared' (Medusa v2) or 'copy' (Medusa v1)"
            )
        self.num_heads, self.num_layers, self.lm_head_mode = num_heads, num_layers, lm_head
        H, V = target.hidden_size, target.vocab_size
        # A fresh ResBlock per (head, layer): no weight sharing.
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(H) for _ in range(num_layers)]) for _ in range(num_heads)
        )
        self.lm_heads = (
            nn.ModuleList(nn.Linear(H, V, bias=False) for _ in range(num_heads))
            if lm_head == "copy"
            else None
        )

    def spec(self) -> dict[str, Any]:
        return {"num_heads": self.num_heads, "num_layers": self.num_layers, "lm_head": self.lm_head_mode}

    @torch.no_grad()
    def init_lm_heads_from_target(self) -> None:
        """Medusa v1: start every per-head lm_head as a copy of the target's."""
        if self.lm_heads is None:
            return
        w = self.shared("lm_head").weight
        for head in self.lm_heads:
            head.weight.copy_(w.to(head.weight.dtype))

    def head_hidden(self, hidden: torch.Tensor, num: int | None = None) -> torch.Tensor:
        """ResBlock outputs of the first ``num`` heads (default all): ``[num, *hidden.shape]``."""
        return torch.stack([blocks(hidden) for blocks in self.blocks[: num or self.num_heads]])

    def head_logits(self, k: int, hidden_k: torch.Tensor) -> torch.Tensor:
        """Logits of head ``k`` from its ResBlock output."""
        if self.lm_heads is not None:
            return self.lm_heads[k](hidden_k)
        return self.shared("lm_head")(hidden_k)

    def heads_logits(self, hs: torch.Tensor) -> torch.Tensor:
        """Logits of the first ``len(hs)`` heads from their ResBlock outputs ``hs [D, ..., H]``.

        With the shared lm_head (v2) this is one matmul over all heads' rows, which on a
        memory-bound device costs about as much as one head.
        """
        if self.lm_heads is None:
            return self.shared("lm_head")(hs)
        return torch.stack([self.lm_heads[k](hs[k]) for k in range(hs.shape[0])])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of every head at every position: ``[K, B, T, V]``; head k predicts x_{t+k+2}."""
        return self.heads_logits(self.head_hidden(hidden))
