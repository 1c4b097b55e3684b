"""DFlash's draft-config facts: its keys and checks, the target layers it reads, its record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds.eagle import default_eagle3_layers
from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.section import DecoderLayers, DraftKind, draft_vocab_problem, section_keys
from draftheads.conf.schema.layers import layer_ids_problem

POSITION_WEIGHTS = ("decay", "dpace")
# the target layers a DFlash drafter reads when draft.dflash.feature_layers is null: EAGLE-3's three
# ("eagle3") or one per drafter layer (the reference's "spread")
FEATURE_RULES = ("eagle3", "spread")
# Shape keys a DFlash drafter layer takes from the target's config unless given (the reference's names).
LAYER_KEYS = (
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "hidden_act",
    "attention_bias",
    "max_position_embeddings",
    "rope_parameters",
)


def dflash_layers_problem(layers: list[int], num_layers: int | None = None) -> str | None:
    """Why ``layers`` cannot be a DFlash drafter's ``draft.dflash.feature_layers``, or None.

    The engines' rule as for EAGLE-3 (ids index the target's ``hidden_states``: distinct,
    ascending, from 1, each the input of a layer the engine can capture, so at most L - 1), but any
    number of layers (the reference uses 1 to 5).
    """
    if not layers:
        return f"draft.dflash.feature_layers={list(layers)}: a DFlash drafter reads at least one target layer"
    return layer_ids_problem(
        layers, num_layers, None if num_layers is None else num_layers - 1, "draft.dflash.feature_layers"
    )


def spread_layers(num_layers: int, depth: int) -> list[int]:
    """The reference DFlash rule (z-lab's ``build_target_layer_ids``), one target layer per drafter
    layer: ``[L // 2]`` for one, else ``round(1 + i (L - 4) / (depth - 1))`` for i < depth, evenly
    from layer 1 to L - 3. Refuses a depth whose ids would not be distinct layers of the target."""
    if depth == 1:
        return [num_layers // 2]
    span = num_layers - 4
    ids = [round(1 + i * span / (depth - 1)) for i in range(depth)]
    if span < 1 or len(set(ids)) != depth:
        raise UserError(
            f"draft.dflash.num_decoder_layers={depth} with draft.dflash.feature_rule=spread needs {depth} distinct target "
            f"layers in 1..{num_layers - 3}, and the target has {num_layers} layers; use at most "
            f"{max(1, num_layers - 3)} drafter layers, or draft.dflash.feature_rule=eagle3"
        )
    return ids


def dflash_feature_layers(
    feature_layers: list[int] | None, num_layers: int, rule: str = "eagle3", depth: int = 1
) -> list[int]:
    """The target layers a DFlash drafter reads: the given ones, else those of ``rule``: EAGLE-3's
    three (``eagle3``: one feature cache serves both drafters) or :func:`spread_layers`."""
    if feature_layers:
        return list(feature_layers)
    return spread_layers(num_layers, depth) if rule == "spread" else default_eagle3_layers(num_layers)


@dataclass
class DFlashSection(DecoderLayers):
    """DFlash's draft.* keys: one non-causal pass drafts a block."""

    block_size: int = 16
    # a token id the tokenizer has and never produces in text; null: the tokenizer's mask token,
    # else its highest unused special token (recorded in the checkpoint)
    mask_token_id: int | None = None
    # loss weight of block position k (1-based): exp(-(k - 1) / gamma)
    loss_gamma: float = 7.0
    # decay: the weights above; dpace: per block, the gradient of its expected accepted length
    # (D-PACE, speculators' default), from the draft's probabilities of the target's tokens
    # smoothed by dpace_alpha (loss_gamma is then unused)
    position_weights: str = "decay"
    dpace_alpha: float = 0.5
    # blocks per training row (per packed document), anchored at random answer positions;
    # 0: a block at every answer position
    anchors_per_row: int = 8
    # the target layers a DFlash drafter reads when draft.dflash.feature_layers is null: eagle3 (EAGLE-3's
    # three, so one feature cache serves both drafters) or spread (the reference's rule: one
    # target layer per drafter layer, L//2 for one, else evenly from 1 to L-3)
    feature_rule: str = FEATURE_RULES[0]
    # the drafter layers' key/value heads (null: the target's). A block row reads its anchor token
    # and the context only through attention values, kv_heads x head_dim wide (SmolLM2: 3 x 64 =
    # 192 of 576); the target's query heads must be a multiple of it
    kv_heads: int | None = None
    # the starting gain of every layer's q and k norms (trained from there). Attention logits
    # scale with its square: at 1 they stay within +-sqrt(head_dim), too flat for a block row to
    # single out its anchor among hundreds of context keys early in training
    qk_gain: float = 1.0
    # the share of training blocks that see none of the target's context, only their own rows, so
    # that the anchor token is the one thing they can read (evaluation and decoding always see the
    # context)
    context_dropout: float = 0.0
    # the first this many optimizer steps train every block blind (the anchor alone), so block
    # position 1 learns to read its anchor before the context can stand in for it
    blind_steps: int = 0
    # the first layer starts with its block rows attending to their anchor row this many nats above
    # the context and mask rows (0: the usual start). Only the starting weights change: the
    # checkpoint and its exports are the same
    anchor_prior: float = 0.0
    # the starting gain of the drafter's output norm. At 1 (the reference's start) a random block
    # state reaches the target's lm_head as sharp as a real one: the first draft logits are
    # confident and wrong (~60 nats of loss on SmolLM2) and the first steps of a short run go to
    # undoing that. Small: the first drafts are near uniform over the draft vocabulary
    out_gain: float = 1.0


class DFlashDraft(DraftKind):
    name = "dflash"
    schema = DFlashSection
    keys = section_keys(DFlashSection)
    options = "draft=dflash"
    same_meaning = {"num_layers": "num_decoder_layers"}
    minimums = {"num_decoder_layers": 1, "block_size": 2, "anchors_per_row": 0, "blind_steps": 0}

    def problem(self, d: Any) -> str | None:
        if d.kv_heads is not None and d.kv_heads < 1:
            return f"draft.dflash.kv_heads={d.kv_heads} must be at least 1; use null for the target's"
        vocab = draft_vocab_problem(d)
        if vocab:
            return vocab
        if d.feature_rule not in FEATURE_RULES:
            return f"draft.dflash.feature_rule={d.feature_rule!r} is unknown; use one of {', '.join(FEATURE_RULES)}"
        if d.qk_gain <= 0:
            return f"draft.dflash.qk_gain={d.qk_gain} must be positive (the q/k norms' starting gain)"
        if d.out_gain <= 0:
            return f"draft.dflash.out_gain={d.out_gain} must be positive (the output norm's starting gain)"
        if d.anchor_prior < 0:
            return f"draft.dflash.anchor_prior={d.anchor_prior} must not be negative (a logit boost in nats; 0 is off)"
        if not 0 <= d.context_dropout < 1:
            return f"draft.dflash.context_dropout={d.context_dropout} must be in [0, 1) (the share of blocks trained blind)"
        if d.loss_gamma <= 0:
            return (
                f"draft.dflash.loss_gamma={d.loss_gamma} must be positive (the loss decay exp(-(k-1)/gamma))"
            )
        if d.position_weights not in POSITION_WEIGHTS:
            return f"draft.dflash.position_weights={d.position_weights!r} is unknown; use one of {', '.join(POSITION_WEIGHTS)}"
        if not 0 < d.dpace_alpha <= 1:
            return f"draft.dflash.dpace_alpha={d.dpace_alpha} must be in (0, 1] (D-PACE's smoothing of each acceptance)"
        if d.mask_token_id is not None and d.mask_token_id < 0:
            return f"draft.dflash.mask_token_id={d.mask_token_id} is not a token id; use null to choose one"
        if d.feature_layers is not None:
            return dflash_layers_problem(list(d.feature_layers))
        return None

    def train_problem(self, d: Any, t: Any) -> str | None:
        if t.soft_labels == "full":
            return (
                "train.soft_labels=full projects the target's final state, which a DFlash drafter does not read; "
                "use train.soft_labels=auto (a feature cache's top-k logits, else the data's next tokens)"
            )
        return None

    def training_layers(self, d: Any, num_layers: int) -> list[int]:
        return dflash_feature_layers(d.feature_layers, num_layers, d.feature_rule, d.num_decoder_layers)


KIND = KindRecord(
    name="dflash",
    section=DFlashDraft(),
    groups=("dflash",),
    drafter="draftheads.heads.dflash.kind:DFlashKind",
    objective="draftheads.train.modules.dflash:DFlashObjective",
    cost="draftheads.train.modules.dflash:dflash_training",
    small={
        "dflash": (
            "draft.dflash.block_size=4",
            "draft.dflash.num_decoder_layers=1",
            "draft.dflash.draft_vocab_size=512",
        )
    },
    proposer="draftheads.decode.proposers.dflash:DFlashProposer",
    bench=(
        BenchDrafter(
            "dflash",
            "dflash",
            ("draft=dflash",),
            "1e-3",
            # EAGLE-3's data, passes and learning rate; 32 blocks per row make a step's matmuls per
            # row token about EAGLE-3's (0.145 against 0.144 GFLOP on the bench's packed rows)
            recipe=("draft.dflash.anchors_per_row=32",),
            reads="own",
            streamed=True,
            flops="forward and backward: fc, context keys and values, the block layers and their attention, "
            "the draft head on the counted positions",
            default=True,
        ),
    ),
)
