"""EAGLE feature-level drafters, built from the target's own decoder-layer class.

EAGLE-1 (``version=1``)::

    x_t   = fc(concat(embed(tok_{t+1}), f_t))          # 2H -> H
    f'_t  = layers(x_t)                                  # first layer has no input norm
    logits = target.lm_head(f'_t)                        # frozen, shared

and ``f'_t`` regresses the target's next feature ``f_{t+1}`` (its final, normed hidden state).

EAGLE-3 (``version=3``)::

    g_t   = fc(concat(h^a_t, h^b_t, h^c_t))             # three target layers, 3H -> H
    x_t   = concat(input_norm(embed(tok_{t+1})), hidden_norm(g_t))   # 2H into q/k/v
    f'_t  = g_t + attn(x_t);  f'_t += mlp(post_norm(f'_t))
    logits = lm_head(norm(f'_t))                         # own head over a reduced vocab

and the draft's own ``f'_t`` is fed back as ``g`` for the next step (training-time test).

EAGLE-3's norm variants (speculators' and vLLM's names, each off by default):
``norm_before_fc`` puts one RMSNorm (``input_norm``, over 3H) before ``fc``; ``fc_norm`` one per
target layer (``fc_norm.{i}``) instead; ``norm_before_residual`` makes the residual of the
attention ``hidden_norm(g_t)`` instead of ``g_t``; ``norm_output`` feeds back ``norm(f'_t)``
(and the logits are ``lm_head`` of it, with no second norm).
The reduced vocabulary maps draft id i to target id ``i + d2t[i]``; ``t2d`` marks the target
ids that the draft vocabulary covers (the EAGLE-3 / SpecForge / vLLM convention).

Layers are Llama decoder layers (transformers' ``LlamaDecoderLayer``, with their own rotary
embedding) whatever the target, sized from its config (:mod:`draftheads.heads.draft_layers`): the
one layer vLLM, SGLang and speculators serve for every target. ``layer_config`` holds those sizes
(an imported checkpoint's own); drafters saved before it held them were built from the target's
layer class, and load when that class computes as Llama's does. The embedding is the target's,
shared at run time and not saved unless ``save_shared`` is set.

A checkpoint's sliding window (``layer_types``, ``sliding_window``) narrows its sliding layers'
mask by token position. The keys' positions are kept in the drafter's own cache, as one more
layer after the decoder's (:meth:`EagleDrafter.key_positions`), so the decoder's cache surgery
(compaction, truncation, dropped rows) moves them with the keys they belong to. The training
unroll keeps them the same way, so a training-time-test step sees the window a decoded chain
sees (vLLM's, by position), where speculators' trainer counts the window from the row instead.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds.eagle import eagle_input_layers, feature_layers_problem
from draftheads.heads.base import Drafter
from draftheads.heads.draft_layers import (
    WINDOW_KEYS,
    check_window,
    llama_layers,
    sliding_layers,
    window_mask,
)
from draftheads.heads.layer_init import copy_layer, last_layers
from draftheads.heads.masks import additive_mask, causal
from draftheads.heads.reduced_vocab import ReducedVocab, check_draft_vocab_size
from draftheads.heads.rotary import Float32Rotary
from draftheads.heads.speculators import EAGLE3_FLAGS
from draftheads.heads.target.fingerprint import TargetFingerprint

# targets whose own decoder layer computes as Llama's: a drafter saved with their layer class loads as Llama
LLAMA_LAYER_TYPES = ("llama", "mistral")


def legacy_layers(target_config: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The Llama layers of a drafter saved without ``layer_config`` (built from the target's layer
    class then): the same for Llama and Mistral targets, refused in one line for any other."""
    model_type = target_config.get("model_type")
    if model_type not in LLAMA_LAYER_TYPES:
        raise UserError(
            f"this EAGLE drafter was saved by an older draftheads with {model_type} decoder layers; drafters are "
            "now Llama layers (what vLLM, SGLang and speculators serve), so retrain it with draftheads train"
        )
    return llama_layers(target_config, num_layers)


class EagleDrafter(Float32Rotary, ReducedVocab, Drafter):
    """EAGLE-1 or EAGLE-3 (``version``): target decoder layers over the target's features and the
    next token's embedding, run once per drafted token."""

    kind = "eagle"

    def __init__(
        self,
        target: TargetFingerprint,
        target_config: dict[str, Any],
        version: int = 1,
        layer_config: dict[str, Any] | None = None,
        num_decoder_layers: int = 1,
        feature_layers: list[int] | None = None,
        draft_vocab_size: int | None = None,
        save_shared: bool = False,
        fc_bias: bool = True,
        norm_before_residual: bool = False,
        norm_before_fc: bool = False,
        fc_norm: bool = False,
        norm_output: bool = False,
    ) -> None:
        super().__init__(target)
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRMSNorm,
            LlamaRotaryEmbedding,
        )

        if version not in (1, 3):
            raise UserError(f"draft.eagle.version={version} is not valid; use 1 (EAGLE-1) or 3 (EAGLE-3)")
        if num_decoder_layers < 1:
            raise UserError(f"draft.eagle.num_decoder_layers={num_decoder_layers}: need at least one layer")
        self.version, self.num_decoder_layers, self.save_shared = version, num_decoder_layers, save_shared
        H, V, L = target.hidden_size, target.vocab_size, target.num_layers
        # the target's config exactly as config.json will hold it
        self.target_config = json.loads(json.dumps(dict(target_config), default=str))
        if layer_config is None:
            layer_config = llama_layers(self.target_config, num_decoder_layers)
        check_window(layer_config, num_decoder_layers)
        self.layer_config = LlamaConfig(**{**layer_config, "num_hidden_layers": num_decoder_layers})
        self.layer_config._attn_implementation = "sdpa"
        if self.layer_config.hidden_size != H:
            raise UserError(
                f"the drafter's layers are {self.layer_config.hidden_size} wide, the target's hidden size is {H}; "
                "an EAGLE drafter works in the target's width"
            )
        self._feature_layers = eagle_input_layers(version, feature_layers, L)
        problem = feature_layers_problem(self._feature_layers, version, L, kind=self.kind)
        if problem:
            raise UserError(problem)
        self.fc_bias = bool(fc_bias) and version == 1  # EAGLE-3's fc never has one
        self.norm_flags = check_norm_flags(
            version,
            norm_before_residual=norm_before_residual,
            norm_before_fc=norm_before_fc,
            fc_norm=fc_norm,
            norm_output=norm_output,
        )
        if version == 3:
            self.draft_vocab_size = check_draft_vocab_size(draft_vocab_size or V, V, self.kind)
            self.fc = nn.Linear(3 * H, H, bias=False)
        else:
            self.draft_vocab_size = V
            self.fc = nn.Linear(2 * H, H, bias=self.fc_bias)
        lc = self.layer_config
        self.window_layers = sliding_layers(lc)
        self.layers = nn.ModuleList(LlamaDecoderLayer(lc, layer_idx=i) for i in range(num_decoder_layers))
        self.keep_rotary(LlamaRotaryEmbedding(lc))
        first = self.layers[0]
        if version == 1:
            first.input_layernorm = nn.Identity()  # EAGLE-1: the first layer has no input norm
        else:
            _widen_attention_input(first, H)
            self.hidden_norm = LlamaRMSNorm(H, eps=lc.rms_norm_eps)
            self.norm = LlamaRMSNorm(H, eps=lc.rms_norm_eps)
            if self.norm_flags["norm_before_fc"]:
                self.input_norm = LlamaRMSNorm(3 * H, eps=lc.rms_norm_eps)
            if self.norm_flags["fc_norm"]:
                self.fc_norm = nn.ModuleList(LlamaRMSNorm(H, eps=lc.rms_norm_eps) for _ in range(3))
            self.lm_head = nn.Linear(H, self.draft_vocab_size, bias=False)
            self.init_reduced_vocab(V)
        if save_shared:
            self.embed_tokens = nn.Embedding(V, H)
            self.embed_tokens.requires_grad_(False)

    # ---- interface -------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        """What config.json stores to rebuild the drafter (EAGLE-1 has no draft vocabulary)."""
        return {
            "target_config": self.target_config,
            "layer_config": self.layer_config_dict(),
            "version": self.version,
            "num_decoder_layers": self.num_decoder_layers,
            "feature_layers": self._feature_layers,
            "draft_vocab_size": self.draft_vocab_size if self.version == 3 else None,
            "save_shared": self.save_shared,
            "fc_bias": self.fc_bias,
            **{k: True for k, v in self.norm_flags.items() if v},  # only the variants in use
        }

    @classmethod
    def saved_spec(cls, spec: dict[str, Any]) -> dict[str, Any]:
        """A spec saved before drafters held ``layer_config``: its layers from :func:`legacy_layers`."""
        if spec.get("layer_config") is not None or not isinstance(spec.get("target_config"), dict):
            return spec
        return {
            **spec,
            "layer_config": legacy_layers(spec["target_config"], spec.get("num_decoder_layers", 1)),
        }

    def layer_config_dict(self) -> dict[str, Any]:
        """The Llama layers' config as ``LlamaConfig`` arguments (what the engines' configs hold)."""
        keys = (
            "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads "
            "head_dim hidden_act max_position_embeddings rms_norm_eps rope_parameters attention_bias mlp_bias "
            "tie_word_embeddings bos_token_id eos_token_id pad_token_id"
        ).split() + list(WINDOW_KEYS if self.window_layers else ())
        lc = self.layer_config
        return json.loads(
            json.dumps({k: getattr(lc, k, None) for k in keys if getattr(lc, k, None) is not None})
        )

    def feature_layers(self) -> list[int]:
        return list(self._feature_layers)

    def training_layers(self) -> list[int]:
        """Input layers plus the final state: the regression and distillation target."""
        return self.feature_layers() + [self.target_fingerprint.num_layers]

    def state_to_save(self) -> dict[str, torch.Tensor]:
        """Own weights; with ``save_shared``, also the target's embedding as ``embed_tokens``."""
        sd = super().state_to_save()
        if self.save_shared and "embed" in self._shared:
            sd["embed_tokens.weight"] = self._shared["embed"].weight.detach().contiguous()
        return sd

    @property
    def maps_ids(self) -> bool:
        """EAGLE-3's own head is over its draft ids, in d2t's order even at the full size (an
        imported checkpoint may permute them); EAGLE-1 drafts with the target's head."""
        return self.version == 3

    @torch.no_grad()
    def init_lm_head_from_target(self) -> None:
        """EAGLE-3: start the reduced lm_head as the target's rows for the draft vocabulary."""
        if self.version == 3:
            rows = self.shared("lm_head").weight[self.target_ids()]
            self.lm_head.weight.copy_(rows.to(self.lm_head.weight.dtype))

    @torch.no_grad()
    def init_from_target(self, target: nn.Module, embed_scale: float = 0.0) -> None:
        """Start the decoder layers as the target's last ones (``draft.eagle.init_from_target``).

        Layer i of n copies target layer ``L - n + i``. EAGLE-3's widened q/k/v read
        concat(embedding, feature): the target's weights go in the feature half, and the
        embedding half is 0 (or N(0, ``embed_scale``)); ``hidden_norm`` starts as the target
        layer's input norm. EAGLE-1's first layer keeps no input norm.
        """
        H = self.target_fingerprint.hidden_size
        sources = last_layers(target, len(self.layers), self.kind)

        def widen(value: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
            if value.dim() == 2 and value.shape[1] == 2 * H:  # [embedding half, feature half]
                half = torch.randn_like(w) * embed_scale if embed_scale > 0 else torch.zeros_like(w)
                return torch.cat([half, w], dim=1)
            return None

        copied = [copy_layer(mine, theirs, widen) for mine, theirs in zip(self.layers, sources)]
        if not any(copied):
            raise UserError(
                f"draft.eagle.init_from_target=true: the target's {type(sources[0]).__name__} shares no tensor (by name "
                "and shape) with the drafter's Llama layers; use draft.eagle.init_from_target=false"
            )
        if self.version == 3 and hasattr(sources[0], "input_layernorm"):
            norm = sources[0].input_layernorm
            self.hidden_norm.load_state_dict(
                {
                    k: v.to(p.dtype)
                    for (k, v), p in zip(norm.state_dict().items(), self.hidden_norm.state_dict().values())
                }
            )

    # ---- compute ---------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self._shared.get("embed") or (self.embed_tokens if self.save_shared else self.shared("embed"))
        return emb(input_ids)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features -> the drafter's H-dim hidden input (EAGLE-3: fc over three layers,
        after ``input_norm`` or the per-layer ``fc_norm`` when the drafter has them)."""
        if self.version != 3:
            return features
        if self.norm_flags["norm_before_fc"]:
            features = self.input_norm(features)
        elif self.norm_flags["fc_norm"]:
            chunks = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(features)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """One drafter pass. ``hidden`` [B,T,H] is fused (or fed-back) features aligned with
        ``input_ids`` [B,T] = the *next* tokens. ``attention_mask`` is an additive 4-D mask
        [B,1,T,S] (None: causal over T with no cache). Returns the output features [B,T,H]."""
        emb = self.embed(input_ids).to(hidden.dtype)
        pos_emb = self.rotary(hidden, position_ids)
        if attention_mask is None and (cache is None or cache.get_seq_length() == 0):
            attention_mask = additive_mask(causal(input_ids.shape[1], hidden.device)[None], hidden.dtype)
        masks = self.layer_masks(attention_mask, position_ids, cache, hidden.dtype)
        if self.version == 3:
            first = self.layers[0]
            normed = self.hidden_norm(hidden)
            x = torch.cat([first.input_layernorm(emb), normed], dim=-1)
            attn_out = first.self_attn(
                hidden_states=x,
                position_embeddings=pos_emb,
                attention_mask=masks[0],
                position_ids=position_ids,
                cache=cache,
                use_cache=cache is not None,
            )[0]
            h = (normed if self.norm_flags["norm_before_residual"] else hidden) + attn_out
            h = h + first.mlp(first.post_attention_layernorm(h))
            start = 1
        else:
            h = self.fc(torch.cat([emb, hidden], dim=-1))
            start = 0
        for i in range(start, len(self.layers)):
            h = _call_layer(self.layers[i], h, masks[i], position_ids, pos_emb, cache)
        return self.norm(h) if self.norm_flags["norm_output"] else h

    def layer_masks(
        self, mask: torch.Tensor | None, position_ids: torch.Tensor, cache, dtype: torch.dtype
    ) -> list[torch.Tensor | None]:
        """Each decoder layer's mask: ``mask`` as given, and for the sliding layers narrowed to
        their window by the positions of the queries and the keys (:func:`window_mask`)."""
        if not self.window_layers:
            return [mask] * len(self.layers)
        k_pos = self.key_positions(position_ids, cache)
        if mask is None:  # a cache and no mask: every key is seen, save what the window hides
            B, T = position_ids.shape
            mask = torch.zeros(B, 1, T, k_pos.shape[1], dtype=dtype, device=position_ids.device)
        narrow = window_mask(self.layer_config, mask, position_ids, k_pos)
        return [narrow if i in self.window_layers else mask for i in range(len(self.layers))]

    def key_positions(self, position_ids: torch.Tensor, cache) -> torch.Tensor:
        """``[B, S]`` the position of every key this pass attends over: the new tokens' own
        without a cache; with one, those the cache holds (one layer after the decoder's, written
        alongside its keys, so it is cut, compacted and row-selected with them), then the new."""
        if cache is None:
            return position_ids
        slot = position_ids[:, None, :, None]
        return cache.update(slot, slot, self.num_decoder_layers)[0][:, 0, :, 0]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft logits: over the draft vocabulary (EAGLE-3) or the full vocabulary (EAGLE-1).
        With ``norm_output`` the output is normed already."""
        if self.version == 3:
            return self.lm_head(out if self.norm_flags["norm_output"] else self.norm(out))
        return self.shared("lm_head")(out)


NORM_FLAGS = EAGLE3_FLAGS  # speculators' and vLLM's names


def check_norm_flags(version: int, **flags: bool) -> dict[str, bool]:
    """EAGLE-3's norm variants as booleans (:data:`NORM_FLAGS`); refused in one line for EAGLE-1,
    and ``norm_before_fc`` with ``fc_norm`` (one norm before fc, or one per layer: not both)."""
    flags = {k: bool(flags.get(k)) for k in NORM_FLAGS}
    on = [k for k, v in flags.items() if v]
    if on and version != 3:
        raise UserError(
            f"draft.eagle.{on[0]}=true is an EAGLE-3 variant; use it with draft=eagle3 (draft.eagle.version=3)"
        )
    if flags["norm_before_fc"] and flags["fc_norm"]:
        raise UserError(
            "draft.eagle.norm_before_fc and draft.eagle.fc_norm are both true; they are alternatives (one norm over the "
            "three target layers, or one per layer): set one"
        )
    return flags


def _widen_attention_input(layer: nn.Module, hidden: int) -> None:
    """EAGLE-3: q/k/v read concat(embedding, feature), so their input is 2H."""
    attn = layer.self_attn
    for p in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attn, p)
        setattr(attn, p, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))


def _call_layer(layer: nn.Module, h, attention_mask, position_ids, pos_emb, cache) -> torch.Tensor:
    out = layer(
        h,
        attention_mask=attention_mask,
        position_ids=position_ids,
        position_embeddings=pos_emb,
        cache=cache,
        use_cache=cache is not None,
    )
    return out[0] if isinstance(out, tuple) else out
