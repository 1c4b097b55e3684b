"""P-EAGLE's draft-config facts: EAGLE-3's drafter and inputs, a mask token, a group of
``num_depths`` tokens drafted in one pass, and conditional-drop sampling of the training groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftheads.conf.schema.kinds.eagle import EagleNorms, eagle_input_layers, feature_layers_problem
from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.section import DecoderLayers, DraftKind, draft_vocab_problem, section_keys

# The deepest group a P-EAGLE drafter trains: every group entry attends to the depths before it,
# and the paper and speculators train groups of 5 to 10; deeper groups pay for depths the
# target almost never accepts.
MAX_DEPTHS = 32


@dataclass
class PEagleSection(EagleNorms, DecoderLayers):
    """P-EAGLE's draft.* keys: EAGLE-3's drafter (its norm variants) drafting a group of tokens in one pass."""

    # tokens one pass drafts (speculators' num_depths); a decoding tree is at most this deep
    num_depths: int = 8
    # conditional drop: depth d >= 1 trains max(ratio**d, ratio_min) of the anchors depth d - 1
    # kept, so training costs a few times EAGLE-3's one step instead of num_depths times
    down_sample_ratio: float = 0.7
    down_sample_ratio_min: float = 0.2
    # at most this many anchors per row seed the deeper depths (null: every answer anchor)
    max_anchors: int | None = None
    # true: train a copy of the whole input embedding, as speculators does; false: the target's
    # embedding, with only the mask token's row the drafter's own (a real token embeds as in EAGLE-3)
    own_embedding: bool = False
    # the mask token the group's later entries read (null: chosen as DFlash's is)
    mask_token_id: int | None = None
    feature_noise: float = 0.0
    # a trained EAGLE-3 drafter (folder or Hub id) of the same target, feature layers, draft
    # vocabulary and norm variants: its fc, layers, norms, head and vocabulary maps start this one
    # (the mask token's embedding and mask_hidden start as without it)
    init_from_eagle3: str | None = None


class PEagleDraft(DraftKind):
    name = "peagle"
    schema = PEagleSection
    keys = section_keys(PEagleSection)
    options = "draft=peagle"
    same_meaning = {"num_layers": "num_decoder_layers", "block_size": "num_depths", "ttt_steps": "num_depths"}

    minimums = {"num_decoder_layers": 1}
    non_negative = ("feature_noise",)

    def problem(self, d: Any) -> str | None:
        vocab = draft_vocab_problem(d)
        if vocab:
            return vocab
        if not 1 <= d.num_depths <= MAX_DEPTHS:
            return (
                f"draft.peagle.num_depths={d.num_depths}: a P-EAGLE group drafts 1 to {MAX_DEPTHS} tokens in one pass; "
                "use e.g. 8 (speculators' default)"
            )
        if not 0 < d.down_sample_ratio <= 1:
            return f"draft.peagle.down_sample_ratio={d.down_sample_ratio} must be in (0, 1] (depth d keeps ratio**d of the anchors)"
        if not 0 <= d.down_sample_ratio_min <= 1:
            return f"draft.peagle.down_sample_ratio_min={d.down_sample_ratio_min} must be in [0, 1] (the least share a depth keeps)"
        if d.down_sample_ratio_min > d.down_sample_ratio:
            return (
                f"draft.peagle.down_sample_ratio_min={d.down_sample_ratio_min} is above draft.peagle.down_sample_ratio="
                f"{d.down_sample_ratio}: every depth would keep the minimum and the ratio would have no effect; "
                f"use a minimum of at most {d.down_sample_ratio}"
            )
        if d.max_anchors is not None and d.max_anchors < 1:
            return f"draft.peagle.max_anchors={d.max_anchors} must be at least 1; use null for every answer anchor"
        if d.init_from_eagle3 is not None and not str(d.init_from_eagle3).strip():
            return (
                "draft.peagle.init_from_eagle3 is empty; give an EAGLE-3 drafter's folder or Hub id, or null"
            )
        if d.init_from_eagle3 is not None and d.init_from_target:
            return (
                "draft.peagle.init_from_eagle3 and draft.peagle.init_from_target both start the decoder layer; "
                "set one of them"
            )
        if d.mask_token_id is not None and d.mask_token_id < 0:
            return f"draft.peagle.mask_token_id={d.mask_token_id} is not a token id; use null to choose one"
        if d.feature_layers is not None:
            return feature_layers_problem(list(d.feature_layers), 3, kind="peagle")
        return None

    def training_layers(self, d: Any, num_layers: int) -> list[int]:
        """EAGLE-3's three input layers plus the final state, the distillation target."""
        return eagle_input_layers(3, d.feature_layers, num_layers) + [num_layers]

    def depth_note(self, d: Any) -> str:
        return "; vLLM serves P-EAGLE drafters of one layer (draft.peagle.num_decoder_layers=1)"


KIND = KindRecord(
    name="peagle",
    section=PEagleDraft(),
    groups=("peagle",),
    drafter="draftheads.heads.peagle.kind:PEagleKind",
    objective="draftheads.train.modules.peagle:PEagleObjective",
    cost="draftheads.train.modules.peagle:peagle_cost",
    small={"peagle": ("draft.peagle.draft_vocab_size=512", "draft.peagle.num_depths=3")},
    proposer="draftheads.decode.proposers.peagle:PEagleProposer",
    # EAGLE-3's recipe, data and passes, streamed from the teacher-forced cache, reading EAGLE-3's
    # layers of it
    bench=(BenchDrafter("peagle", "peagle", ("draft=peagle",), "1e-3", reads="own", streamed=True),),
)
