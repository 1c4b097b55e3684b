"""DFlash block drafters: one non-causal pass drafts a whole block from the target's features.

A block of ``B`` positions starting at ``p`` (the position of the last accepted token)::

    x      = embed([tok_p, mask, mask, ..., mask])                 # [B, H], target's embedding
    ctx    = hidden_norm(fc(concat(h^a, h^b, ...)))                # [C, H], target features at < p
    per layer:  q = q_proj(norm(x));  k, v = [k_proj(ctx) ; k_proj(norm(x))], [v_proj(ctx) ; ...]
                x = x + o_proj(attn(q, k, v))   # no causal mask inside the block
                x = x + mlp(post_norm(x))
    logits = lm_head(norm(x))[1:]              # the target's lm_head (rows of the draft vocab)

Block row ``k`` (1 .. B-1) predicts the token at ``p + k``. The context keys and values of a
layer depend only on the target's features (not on the block), so a decoder computes them once
per accepted position with :meth:`DFlashDrafter.context_kv` and keeps them; training computes
them for a whole row and lets each block see only the context before its anchor (the mask).

The layout follows z-lab's reference drafter (Qwen3-style layers with q/k norms, ``fc``,
``hidden_norm``, ``norm``), so its checkpoints convert by renaming nothing but the config.
``feature_layers`` index the target's ``hidden_states`` tuple as everywhere in draftheads
(index ``i`` is the input of layer ``i``); the reference's ``target_layer_ids`` are those
minus one (it reads ``hidden_states[id + 1]``, the output of layer ``id``).

The target's embedding and lm_head are shared and frozen, never stored. A reduced draft
vocabulary keeps the target's lm_head rows of its ids (``d2t``/``t2d`` as EAGLE-3): the head
costs more than the layers on a CPU, so it is what makes a block draft cheap.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds.dflash import LAYER_KEYS, dflash_feature_layers, dflash_layers_problem
from draftheads.heads.attention import foldable, grouped_attention
from draftheads.heads.base import Drafter
from draftheads.heads.draft_layers import llama_layers
from draftheads.heads.layer_init import copy_layer, last_layers
from draftheads.heads.reduced_vocab import ReducedVocab, check_draft_vocab_size, frozen_rows
from draftheads.heads.rotary import Float32Rotary
from draftheads.heads.target.fingerprint import TargetFingerprint


def layer_shape(target_config: dict[str, Any], given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The drafter layers' shape: ``given`` keys first, then the sizes any target's config gives
    a drafter's own layers (:func:`~draftheads.heads.draft_layers.llama_layers`: heads, head size,
    MLP width, eps, a flat rope, SiLU)."""
    given = dict(given or {})
    base = llama_layers(target_config, 1)
    out = {
        key: given.get(key, base.get(key)) for key in LAYER_KEYS if given.get(key, base.get(key)) is not None
    }
    heads = int(out["num_attention_heads"])
    if heads % int(out["num_key_value_heads"]):
        raise UserError(
            f"draft.dflash.kv_heads={out['num_key_value_heads']} does not divide the {heads} query heads; "
            f"use a divisor of {heads}, or null for the target's"
        )
    return json.loads(json.dumps(out))


def llama_config(hidden: int, shape: dict[str, Any]):
    """A LlamaConfig with the drafter layers' shape: its RMSNorm, MLP and RoPE are what we reuse."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=hidden, num_hidden_layers=1, **shape)


class DFlashAttention(nn.Module):
    """Queries from the block; keys and values from the context followed by the block (no causal mask)."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        H, D = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, D
        bias = bool(config.attention_bias)
        self.q_proj = nn.Linear(H, self.heads * D, bias=bias)
        self.k_proj = nn.Linear(H, self.kv_heads * D, bias=bias)
        self.v_proj = nn.Linear(H, self.kv_heads * D, bias=bias)
        self.o_proj = nn.Linear(self.heads * D, H, bias=bias)
        self.q_norm = LlamaRMSNorm(D, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(D, eps=config.rms_norm_eps)

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``k = rope(k_norm(k_proj(x)))``, ``v = v_proj(x)``, each ``[B, kv_heads, T, D]``."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return rope(k, cos, sin), v

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``q = rope(q_norm(q_proj(x)))`` ``[B, heads, T, D]`` of the block rows ``x``."""
        B, T, _ = x.shape
        return rope(
            self.q_norm(self.q_proj(x).view(B, T, self.heads, self.head_dim)).transpose(1, 2), cos, sin
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """``x [B, T, H]`` (normed block states); ``mask [B, 1, T, C + T]`` bool or additive."""
        B, T, _ = x.shape
        q = self.queries(x, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k, v = torch.cat([ctx_k, k], 2), torch.cat([ctx_v, v], 2)
        if foldable(q, k, mask):  # grouped heads: no copy of the context's keys per query head
            out = grouped_attention(q, k, v, mask)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads
            )
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))


class DFlashLayer(nn.Module):
    """A pre-norm decoder layer whose attention reads the injected context (z-lab's layout)."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [B, heads, T, D]`` with ``cos, sin [B, T, D]``: x·cos + rotate_half(x)·sin."""
    from transformers.models.llama.modeling_llama import rotate_half

    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashDrafter(Float32Rotary, ReducedVocab, Drafter):
    """A block drafter: ``num_decoder_layers`` non-causal layers over the fused target features of
    ``feature_layers``, drafting ``block_size - 1`` tokens after an anchor in one pass."""

    kind = "dflash"

    def draft_depth(self) -> int | None:
        """One block drafts ``block_size - 1`` tokens."""
        return self.block_size - 1

    def depth_limit(self) -> str:
        return f"the DFlash drafter's block of {self.block_size} drafts {self.block_size - 1}"

    def __init__(
        self,
        target: TargetFingerprint,
        target_config: dict[str, Any],
        mask_token_id: int,
        block_size: int = 16,
        num_decoder_layers: int = 1,
        feature_layers: list[int] | None = None,
        draft_vocab_size: int | None = None,
        layer_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(target)
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        H, V, L = target.hidden_size, target.vocab_size, target.num_layers
        if block_size < 2:
            raise UserError(
                f"draft.dflash.block_size={block_size} must be at least 2 (the root and one draft)"
            )
        if num_decoder_layers < 1:
            raise UserError(f"draft.dflash.num_decoder_layers={num_decoder_layers}: need at least one layer")
        if not 0 <= int(mask_token_id) < V:
            raise UserError(
                f"draft.dflash.mask_token_id={mask_token_id} is not a token id of the target's vocabulary (0..{V - 1})"
            )
        self.block_size, self.num_decoder_layers = int(block_size), int(num_decoder_layers)
        self.mask_token_id = int(mask_token_id)
        self._feature_layers = dflash_feature_layers(feature_layers, L)
        problem = dflash_layers_problem(self._feature_layers, L)
        if problem:
            raise UserError(problem)
        cfg = json.loads(json.dumps(dict(target_config), default=str))
        self.target_config = cfg
        self.layer_shape = layer_shape(cfg, layer_config)
        self.layer_config = llama_config(H, self.layer_shape)
        self.draft_vocab_size = check_draft_vocab_size(draft_vocab_size or V, V, self.kind)
        self.fc = nn.Linear(len(self._feature_layers) * H, H, bias=False)
        self.hidden_norm = LlamaRMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(self.layer_config) for _ in range(num_decoder_layers))
        self.norm = LlamaRMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.keep_rotary(LlamaRotaryEmbedding(self.layer_config))
        self.init_reduced_vocab(V)

    # ---- interface -------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        """What config.json stores to rebuild the drafter: the shape, the mask token and the
        draft vocabulary's size (its ids are the ``d2t`` buffer)."""
        return {
            "target_config": self.target_config,
            "mask_token_id": self.mask_token_id,
            "block_size": self.block_size,
            "num_decoder_layers": self.num_decoder_layers,
            "feature_layers": list(self._feature_layers),
            "draft_vocab_size": self.draft_vocab_size,
            "layer_config": self.layer_shape,
        }

    def feature_layers(self) -> list[int]:
        return list(self._feature_layers)

    def training_layers(self) -> list[int]:
        """The input layers only: labels come from the target's tokens or its cached top-k."""
        return self.feature_layers()

    def attach(self, target: nn.Module, check: bool = True) -> DFlashDrafter:
        super().attach(target, check)
        self.vocab_changed()  # the reduced head is rebuilt from this target's lm_head
        return self

    def vocab_changed(self) -> None:
        """The frozen reduced head is rebuilt from the current ids and lm_head on first use."""
        self._shared.pop("draft_head", None)

    def head(self) -> nn.Module:
        """The frozen output layer: the target's lm_head, or a linear over its draft-vocab rows.

        The reduced head is an ``nn.Linear`` outside the module tree (never trained or saved);
        :meth:`runtime_modules` hands it to the decoder's backend so its weight is packed too.
        """
        lm_head = self.shared("lm_head")
        if not self.reduced_vocab:
            return lm_head
        head = self._shared.get("draft_head")
        w = lm_head.weight
        if head is None or head.weight.device != w.device or head.weight.dtype != w.dtype:
            head = frozen_rows(w, self.target_ids())
            self._shared["draft_head"] = head
        return head

    def runtime_modules(self) -> list[nn.Module]:
        """Frozen modules the drafter computes with that live outside its module tree."""
        return [self.head()] if self.reduced_vocab else []

    @torch.no_grad()
    def init_from_target(self, target: nn.Module) -> None:
        """Start the drafter layers as the target's last ones (``draft.dflash.init_from_target``): layer
        i of n copies target layer ``L - n + i``'s projections, MLP and norms, where the target's
        layer has this layout (a Llama-like one); the q/k norms the target lacks stay identity."""
        for mine, theirs in zip(self.layers, last_layers(target, len(self.layers), self.kind)):
            if not copy_layer(mine, theirs):
                raise UserError(
                    f"draft.dflash.init_from_target=true: {type(theirs).__name__} shares no weights with a DFlash "
                    "layer (a Llama-like layout); use draft.dflash.init_from_target=false"
                )

    @torch.no_grad()
    def set_qk_gain(self, gain: float) -> None:
        """Start every layer's q and k norm gains at ``gain`` (``draft.dflash.qk_gain``): logits
        q·k/sqrt(D) of unit-RMS heads scale by gain², so the attention can be sharp from the start."""
        for layer in self.layers:
            layer.self_attn.q_norm.weight.fill_(gain)
            layer.self_attn.k_norm.weight.fill_(gain)

    @torch.no_grad()
    def set_out_gain(self, gain: float) -> None:
        """Start the output norm's gain at ``gain`` (``draft.dflash.out_gain``): the draft logits
        ``lm_head(norm(x))`` scale with it, so a small one starts the drafts near uniform."""
        self.norm.weight.fill_(gain)

    # ---- compute ---------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.shared("embed")(input_ids)

    def rotary_at(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[B, T, head_dim]`` at ``positions [B, T]``, in ``x``'s dtype."""
        return self.rotary(x, positions)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[B, C, K*H]`` -> the context states ``hidden_norm(fc(.))`` ``[B, C, H]``."""
        return self.hidden_norm(self.fc(features))

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's context keys and values ``[B, kv_heads, C, D]`` for target features at
        ``positions [B, C]``. They depend on the features alone, so a decoder keeps them."""
        ctx = self.fuse(features.to(self.fc.weight.dtype))
        cos, sin = self.rotary_at(ctx, positions)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward(
        self,
        block_ids: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """The block pass: ``block_ids [B, T]`` at ``positions [B, T]`` (several blocks may sit in
        one row), ``context`` from :meth:`context_kv` (C entries per layer), ``mask [B, 1, T, C + T]``
        (bool: True = may attend, or additive). Returns the normed output states ``[B, T, H]``."""
        x = self.embed(block_ids).to(self.fc.weight.dtype)
        cos, sin = self.rotary_at(x, positions)
        for layer, (k, v) in zip(self.layers, context):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft logits over the draft vocabulary from the block's output states."""
        return self.head()(out)

    def block_inputs(self, root: torch.Tensor) -> torch.Tensor:
        """``[B, block_size]`` block tokens: each row's last accepted token, then mask tokens."""
        block = torch.full(
            (root.shape[0], self.block_size), self.mask_token_id, dtype=torch.long, device=root.device
        )
        block[:, 0] = root
        return block


def mask_token(asked: int | None, tokenizer, vocab_size: int) -> int:
    """``draft.dflash.mask_token_id`` when set, else the tokenizer's choice (:func:`choose_mask_token`),
    else (no tokenizer) the last id of the vocabulary."""
    if asked is not None:
        return asked
    return choose_mask_token(tokenizer) if tokenizer is not None else vocab_size - 1


def ordinary_token(mask_id: int, tokenizer) -> str | None:
    """The text of token ``mask_id`` when it is an ordinary text token (text produces it, so it
    cannot mark the positions to draft), else None: a special token of the tokenizer, or an id past
    its vocabulary, which no text maps to."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    if mask_id in special or mask_id >= len(tokenizer):
        return None
    return str(tokenizer.convert_ids_to_tokens(mask_id))


def choose_mask_token(tokenizer) -> int:
    """A token id the tokenizer has and never produces in text: its mask token when it has one,
    else the highest-id added special token that is not bos/eos/pad/unk and that the chat template
    does not use. One line when there is none."""
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask is not None:
        return int(mask)
    used = {getattr(tokenizer, f"{n}_token_id", None) for n in ("bos", "eos", "pad", "unk")}
    template = getattr(tokenizer, "chat_template", None) or ""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    candidates = [
        int(i)
        for i, tok in added.items()
        if getattr(tok, "special", False)
        and int(i) not in used
        and getattr(tok, "content", str(tok)) not in template
    ]
    if not candidates:
        raise UserError(
            "the tokenizer has no mask token and no unused special token to draft with; "
            "set draft.dflash.mask_token_id=ID to a token id that never occurs in text"
        )
    return max(candidates)
