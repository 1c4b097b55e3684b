"""EAGLE-1's and EAGLE-3's draft-config facts: their keys and checks, the target layers they read, their record."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds.record import BenchDrafter, KindRecord
from draftheads.conf.schema.kinds.section import DecoderLayers, DraftKind, draft_vocab_problem, section_keys
from draftheads.conf.schema.layers import layer_ids_problem

EAGLE_VERSIONS = (1, 3)


def feature_layers_problem(
    layers: list[int],
    version: int,
    num_layers: int | None = None,
    last: int | None = None,
    kind: str = "eagle",
) -> str | None:
    """Why ``layers`` cannot be an EAGLE drafter's ``draft.<kind>.feature_layers`` (EAGLE's or
    P-EAGLE's), or None.

    Ids index the target's ``hidden_states`` (the input of layer i). Serving engines capture each
    auxiliary layer once, in ascending layer order, as ``hidden_states + residual``, which does
    not exist at layer 0; so the ids must be distinct, ascending and at least 1, or the engine
    permutes fc's input columns (unsorted), crashes (duplicates) or fails at layer 0. With
    ``num_layers`` the ids must also be at most ``last`` (default ``num_layers``: the final state).
    """
    key = f"draft.{kind}.feature_layers={list(layers)}"
    count = 3 if version == 3 else 1
    if len(layers) != count:
        return f"{key}: EAGLE-{version} reads {count} target layer(s), this lists {len(layers)}"
    return layer_ids_problem(
        layers, num_layers, num_layers if last is None else last, f"draft.{kind}.feature_layers"
    )


def default_eagle3_layers(num_layers: int) -> list[int]:
    """EAGLE-3's three feature layers for an ``num_layers``-layer target: distinct, ascending, >= 1.

    Inputs of layers 2, L//2 and L-3 (as in EAGLE-3, SpecForge and vLLM) when those are distinct
    (L >= 7); for 4 to 6 layers, the inputs of layers 1, L//2 and L-1. Targets with fewer than 4
    layers have fewer than three servable layers (1..L-1) and are refused: name the layers
    with ``draft.eagle.feature_layers`` or use EAGLE-1.
    """
    if num_layers >= 7:
        return [2, num_layers // 2, num_layers - 3]
    if num_layers >= 4:
        return [1, num_layers // 2, num_layers - 1]
    raise UserError(
        f"EAGLE-3 reads three distinct target layers from 1..L-1, and this target has only "
        f"{num_layers} layer(s); set draft.eagle.feature_layers=[...] explicitly or use draft=eagle"
    )


def eagle_input_layers(version: int, feature_layers: list[int] | None, num_layers: int) -> list[int]:
    """The target layers an EAGLE drafter reads: the given ones, else EAGLE-3's three or the last."""
    if feature_layers:
        return list(feature_layers)
    return default_eagle3_layers(num_layers) if version == 3 else [num_layers]


@dataclass
class EagleNorms:
    """EAGLE-3's norm variants, as speculators and vLLM name them (see heads/eagle/model.py): an
    RMSNorm over the three target layers before fc (norm_before_fc) or one per layer (fc_norm), the
    attention's residual taken after hidden_norm (norm_before_residual), and the normed output fed
    back between drafted tokens (norm_output)."""

    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    def norm_flags(self) -> dict[str, bool]:
        """The norm variants, as the drafter's keyword arguments (EAGLE-1 refuses them there)."""
        return {f.name: getattr(self, f.name) for f in fields(EagleNorms)}


@dataclass
class EagleSection(EagleNorms, DecoderLayers):
    """EAGLE-1's and EAGLE-3's draft.* keys."""

    version: int = 1
    ttt_steps: int = 7
    ttt_decay: float = 0.8
    feature_loss_weight: float = 1.0
    token_loss_weight: float = 0.1
    feature_noise: float = 0.0
    save_shared: bool = False
    # EAGLE-1 only: fc over concat(embedding, feature) with a bias. vLLM builds this fc without
    # one (and drops fc.bias), so a drafter meant for vLLM is trained with fc_bias=false.
    fc_bias: bool = True


class EagleDraft(DraftKind):
    name = "eagle"
    schema = EagleSection
    keys = section_keys(EagleSection)
    options = "draft=eagle or draft=eagle3"
    same_meaning = {"num_layers": "num_decoder_layers"}
    minimums = {"num_decoder_layers": 1, "ttt_steps": 1}
    non_negative = ("feature_loss_weight", "token_loss_weight", "ttt_decay", "feature_noise")

    def problem(self, d: Any) -> str | None:
        if d.version not in EAGLE_VERSIONS:
            return f"draft.eagle.version={d.version} is not valid; use 1 (EAGLE-1) or 3 (EAGLE-3)"
        if not 0 < d.ttt_decay <= 1:
            return f"draft.eagle.ttt_decay={d.ttt_decay} must be in (0, 1]"
        vocab = draft_vocab_problem(d)
        if vocab:
            return vocab
        if d.feature_layers is not None:
            return feature_layers_problem(list(d.feature_layers), d.version)
        return None

    def train_problem(self, d: Any, t: Any) -> str | None:
        if d.version == 1 and d.ttt_steps > 1 and d.feature_loss_weight == 0:
            return "draft=eagle with ttt_steps>1 needs draft.eagle.feature_loss_weight>0"
        return None

    def training_layers(self, d: Any, num_layers: int) -> list[int]:
        """The input layers plus the final state, the regression and distillation target."""
        return eagle_input_layers(d.version, d.feature_layers, num_layers) + [num_layers]

    def depth_note(self, d: Any) -> str:
        return (
            "; vLLM and SGLang serve EAGLE-3 drafters of one layer (draft.eagle.num_decoder_layers=1)"
            if d.version == 3
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
    small={"eagle3": ("draft.eagle.draft_vocab_size=512",)},
    proposer="draftheads.decode.proposers.eagle:EagleProposer",
    bench=(
        BenchDrafter("eagle", "eagle", ("draft=eagle",), "5e-4", version=1, lead=True),
        BenchDrafter(
            "eagle3",
            "eagle",
            ("draft=eagle3",),
            "1e-3",
            version=3,
            streamed=True,
            lead=True,
            row_base=True,
            default=True,
        ),
    ),
)
