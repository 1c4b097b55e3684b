"""P-EAGLE: EAGLE-3's drafter drafting all k tokens of a step in one pass.

The drafter is EAGLE-3's (:class:`~draftheads.heads.eagle.EagleDrafter`, version 3: fc over
three target layers, one widened first layer, its own lm_head over a reduced vocabulary, the
norm variants). P-EAGLE adds two learned inputs and a group pass. A group anchored at row t::

    depth 0:  x_0 = embed(x_{t+1}),  g_0 = fc(f_t)                   at position t
    depth d:  x_d = embed(mask),     g_d = fc(mask_hidden)            at position t + d  (d >= 1)
    out_0 .. out_{k-1} = layers over [x_d, g_d] with attention (group.py):
              the context (real pairs at rows <= t) and the group's depths <= d
    logits_d = lm_head(norm(out_d))  predicts x_{t+d+2}

so one forward gives k draft distributions, none of which reads another's sampled token (the
first is EAGLE-3's first step exactly). ``mask_hidden`` [1, 1, 3H] is a learned stand-in for
the three target features a mask position does not have (fc and the fc norms apply to it as to
a real one); the mask token's embedding is learned too. As speculators trains the whole input
embedding of a P-EAGLE drafter, ``own_embedding`` keeps a trainable copy of it
(``embed_tokens``, saved); by default the target's embedding is shared and only the mask
token's row is the drafter's own (``mask_embed`` [H]), so a real token embeds as in EAGLE-3.

Training runs a group at every row at once (:meth:`PEagleDrafter.group`, entries from
:mod:`~draftheads.heads.peagle.sampling`); decoding runs one group after the accepted pairs
(:func:`~draftheads.heads.peagle.draft.parallel_draft`). The layout follows speculators'
``PEagleDraftModel`` (``models/peagle/core.py``): :mod:`~draftheads.heads.peagle.convert` maps
its checkpoints by moving ``hidden_norm`` and the embedding's mask row, nothing else.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.eagle import EagleDrafter
from draftheads.heads.masks import additive_mask
from draftheads.heads.peagle.group import gather_rows, group_mask, group_positions
from draftheads.heads.target.fingerprint import TargetFingerprint

EAGLE_ONLY = ("version", "save_shared", "fc_bias")  # EagleDrafter arguments P-EAGLE fixes


class PEagleDrafter(EagleDrafter):
    """EAGLE-3 with a mask token and a learned mask feature: ``num_depths`` tokens per pass."""

    kind = "peagle"

    def __init__(
        self,
        target: TargetFingerprint,
        target_config: dict[str, Any],
        mask_token_id: int,
        num_depths: int = 8,
        layer_config: dict[str, Any] | None = None,
        num_decoder_layers: int = 1,
        feature_layers: list[int] | None = None,
        draft_vocab_size: int | None = None,
        own_embedding: bool = False,
        norm_before_residual: bool = False,
        norm_before_fc: bool = False,
        fc_norm: bool = False,
        norm_output: bool = False,
    ) -> None:
        super().__init__(
            target,
            target_config,
            version=3,
            layer_config=layer_config,
            num_decoder_layers=num_decoder_layers,
            feature_layers=feature_layers,
            draft_vocab_size=draft_vocab_size,
            norm_before_residual=norm_before_residual,
            norm_before_fc=norm_before_fc,
            fc_norm=fc_norm,
            norm_output=norm_output,
        )
        V, H = target.vocab_size, target.hidden_size
        if not 0 <= int(mask_token_id) < V:
            raise UserError(
                f"draft.peagle.mask_token_id={mask_token_id} is not a token id of the target (0..{V - 1}); "
                "use a token the tokenizer never produces in text, e.g. an unused special token"
            )
        if int(num_depths) < 1:
            raise UserError(
                f"draft.peagle.num_depths={num_depths}: a P-EAGLE group drafts at least one token"
            )
        self.mask_token_id, self.num_depths = int(mask_token_id), int(num_depths)
        self.own_embedding = bool(own_embedding)
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, self.fc.in_features))  # speculators' start
        if self.own_embedding:
            self.embed_tokens = nn.Embedding(V, H)
        else:
            self.mask_embed = nn.Parameter(torch.zeros(H))

    # ---- interface -------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        """EAGLE-3's spec without its fixed arguments, plus the mask token, depth and embedding."""
        spec = {k: v for k, v in super().spec().items() if k not in EAGLE_ONLY}
        return {
            **spec,
            "mask_token_id": self.mask_token_id,
            "num_depths": self.num_depths,
            "own_embedding": self.own_embedding,
        }

    @torch.no_grad()
    def init_embedding_from_target(self) -> None:
        """Start the mask token's embedding (with ``own_embedding``, the whole table) as the target's."""
        weight = self.shared("embed").weight
        if self.own_embedding:
            self.embed_tokens.weight.copy_(weight.to(self.embed_tokens.weight.dtype))
        else:
            self.mask_embed.copy_(weight[self.mask_token_id].to(self.mask_embed.dtype))

    def input_embedding(self) -> torch.Tensor:
        """``[V, H]``: the embedding the drafter reads, the mask row its own (what an export writes)."""
        if self.own_embedding:
            return self.embed_tokens.weight.detach()
        weight = self.shared("embed").weight.detach().clone()
        weight[self.mask_token_id] = self.mask_embed.detach().to(weight.dtype)
        return weight

    # ---- compute ---------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: the own table, or the target's with the mask token's row replaced."""
        if self.own_embedding:
            return self.embed_tokens(input_ids)
        emb = self.shared("embed")(input_ids)
        is_mask = (input_ids == self.mask_token_id)[..., None]
        return torch.where(is_mask, self.mask_embed.to(emb.dtype), emb)

    def mask_feature(self) -> torch.Tensor:
        """``[H]``: ``fuse(mask_hidden)``, the hidden input of every mask entry (fc and its norms
        are per row, so fusing it once equals fusing it in place of a real feature)."""
        return self.fuse(self.mask_hidden).reshape(-1)

    def group(
        self,
        features: torch.Tensor,
        next_ids: torch.Tensor,
        positions: torch.Tensor,
        docs: torch.Tensor,
        anchor: torch.Tensor,
        depth: torch.Tensor,
        keep: torch.Tensor,
    ) -> torch.Tensor:
        """One pass over group entries: ``[B, N, H]`` outputs (logits via :meth:`logits`).

        ``features [B, R, 3H]`` are f_0 .. f_{R-1}, ``next_ids [B, R]`` the tokens x_1 .. x_R
        that pair with them, ``positions``/``docs [B, R]`` each row's (per-document) position
        and document; ``anchor``/``depth``/``keep [B, N]`` the entries
        (:func:`~draftheads.heads.peagle.sampling.group_entries`)."""
        real = depth == 0
        fused = gather_rows(self.fuse(features), anchor)
        hidden = torch.where(real[..., None], fused, self.mask_feature().to(fused.dtype))
        ids = torch.where(real, next_ids.gather(1, anchor), self.mask_token_id)
        allowed = group_mask(anchor, depth, keep, docs)
        return self(
            ids, hidden, group_positions(positions, anchor, depth), additive_mask(allowed, hidden.dtype)
        )
