"""EAGLE-1's and EAGLE-3's draft-config facts."""

from __future__ import annotations

from typing import Any

from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.registry import DraftKind
from draftheads.conf.schema.layers import eagle_input_layers, feature_layers_problem


class EagleDraft(DraftKind):
    name = "eagle"
    keys = (
        "version", "ttt_steps", "ttt_decay", "feature_loss_weight", "token_loss_weight", "feature_noise",
        "save_shared", "fc_bias", "num_decoder_layers", "feature_layers", "draft_vocab_size", "init_from_target",
        "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
    )  # fmt: skip
    options = "draft=eagle or draft=eagle3"
    same_meaning = {"num_layers": "num_decoder_layers"}

    def problem(self, d: Any) -> str | None:
        if d.feature_layers is not None:
            return feature_layers_problem(list(d.feature_layers), d.version)
        return None

    def train_problem(self, d: Any, t: Any) -> str | None:
        if d.version == 1 and d.ttt_steps > 1 and d.feature_loss_weight == 0:
            return "draft=eagle with ttt_steps>1 needs draft.feature_loss_weight>0"
        return None

    def training_layers(self, d: Any, num_layers: int) -> list[int]:
        """The input layers plus the final state, the regression and distillation target."""
        return eagle_input_layers(d.version, d.feature_layers, num_layers) + [num_layers]

    def depth_note(self, version: int) -> str:
        return (
            "; vLLM and SGLang serve EAGLE-3 drafters of one layer (draft.num_decoder_layers=1)"
            if version == 3
            else ""
        )

    def topk_labels(self, d: Any) -> str:
        """EAGLE-3 learns the cached top-k; EAGLE-1's token loss needs the full distribution."""
        return "learns" if d.version == 3 else "full"

    def serving_note(self, d: Any) -> str | None:
        if d.version != 3:
            return None
        layers = d.num_decoder_layers
        return "vLLM and SGLang serve EAGLE-3 drafters of one decoder layer; " + (
            "this one has 1"
            if layers == 1
            else f"this one has {layers}, so it decodes in draftheads only (export refuses it)"
        )


KIND = KindRecord(
    name="eagle",
    section=EagleDraft(),
    groups=("eagle", "eagle3"),
    drafter="draftheads.heads.eagle.kind:EagleKind",
    objective="draftheads.train.modules.eagle:EagleObjective",
    cost="draftheads.train.modules.eagle:eagle_training",
    proposer="draftheads.decode.proposers.eagle:EagleProposer",
    bench=(
        BenchDrafter("eagle", "eagle", ("draft=eagle",), "5e-4", version=1, eagle=True),
        BenchDrafter(
            "eagle3", "eagle", ("draft=eagle3",), "1e-3", version=3, streamed=True, eagle=True, row_base=True
        ),
    ),
)
