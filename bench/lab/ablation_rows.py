"""The bench's ablation rows: each a named list of overrides on the bench's recipe for its
drafter, trained at equal data (``bench.ablations``; :mod:`bench.lab.study` runs them)."""

from __future__ import annotations

from draftheads.bench.drafter_only import ALONE, decode_overrides

# recipe switches, each a row of overrides on the bench's EAGLE-3 (or Medusa, or DFlash) recipe;
# ``decode.*`` overrides change how a row's drafter is decoded, not how it is trained, so such
# a row decodes the drafter of the first row trained the same way (see :func:`bench.lab.study.drafter_row`)
ABLATIONS: dict[str, list[str]] = {
    "eagle3": [],
    "eagle3 init from target": ["draft.eagle.init_from_target=true"],
    "eagle3 ttt 7": ["draft.eagle.ttt_steps=7"],
    "eagle3 vocab 16k": ["draft.eagle.draft_vocab_size=16384"],
    "eagle3 vocab 32k": ["draft.eagle.draft_vocab_size=32768"],
    "eagle3 full labels": ["train.soft_labels=full"],
    "medusa": ["draft=medusa"],
    "medusa 3 heads": ["draft=medusa", "draft.medusa.num_heads=3"],
    "medusa 2 resblocks": ["draft=medusa", "draft.medusa.num_layers=2"],
    "medusa-2": ["draft=medusa2"],
    "dflash": ["draft=dflash"],
    # draft=dflash's defaults before two layers with γ 1 won at the full bench's data
    "dflash 1 layer": ["draft=dflash"],
    # twice the blocks of half the size: as many block rows, so about the same compute
    "dflash block 8": ["draft=dflash", "draft.dflash.block_size=8", "draft.dflash.anchors_per_row=64"],
    "dflash 2 layers": ["draft=dflash", "draft.dflash.num_decoder_layers=2"],
    "dflash 3 layers": ["draft=dflash", "draft.dflash.num_decoder_layers=3"],
    "dflash 5 layers": ["draft=dflash", "draft.dflash.num_decoder_layers=5"],
    # a second layer lets block position k read position k-1's first-layer guess: train position 2 too
    "dflash 2 layers gamma 1": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=2",
        "draft.dflash.loss_gamma=1",
    ],
    "dflash 2 layers gamma 2": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=2",
        "draft.dflash.loss_gamma=2",
    ],
    "dflash 3 layers gamma 1": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=3",
        "draft.dflash.loss_gamma=1",
    ],
    # twice the blocks per row on the defaults' depth and decay: more labels from each answer token
    "dflash 2 layers gamma 1 64 anchors": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=2",
        "draft.dflash.loss_gamma=1",
        "draft.dflash.anchors_per_row=64",
    ],
    "dflash gamma 4": ["draft=dflash", "draft.dflash.loss_gamma=4"],
    "dflash gamma 14": ["draft=dflash", "draft.dflash.loss_gamma=14"],
    "dflash chain": ["draft=dflash", "decode.tree=chain"],
    # the reference DFlash recipe's levers, one at a time on the bench's DFlash recipe
    "dflash regenerated": ["draft=dflash", "bench.data=regenerated"],
    "dflash spread": ["draft=dflash", "draft.dflash.feature_rule=spread"],
    "dflash 2 layers spread": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=2",
        "draft.dflash.feature_rule=spread",
    ],
    "dflash 3 layers spread": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=3",
        "draft.dflash.feature_rule=spread",
    ],
    "dflash 5 layers spread": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=5",
        "draft.dflash.feature_rule=spread",
    ],
    "dflash 128 anchors": ["draft=dflash", "draft.dflash.anchors_per_row=128"],
    "dflash every anchor": ["draft=dflash", "draft.dflash.anchors_per_row=0"],
    # a block at every answer position, shorter blocks: γ 0.5 trains positions 1-3 only anyway
    "dflash block 8 every anchor": [
        "draft=dflash",
        "draft.dflash.block_size=8",
        "draft.dflash.anchors_per_row=0",
    ],
    "dflash block 4 every anchor": [
        "draft=dflash",
        "draft.dflash.block_size=4",
        "draft.dflash.anchors_per_row=0",
    ],
    "dflash 2 passes": ["draft=dflash", "bench.epochs=2"],
    "dflash 4 passes": ["draft=dflash", "bench.epochs=4"],
    "dflash reference lr": [
        "draft=dflash",
        "train.lr=6e-4",
        "train.warmup_steps=0",
        "train.warmup_ratio=0.04",
    ],
    "dflash init from target": ["draft=dflash", "draft.dflash.init_from_target=true"],
    "dflash qk gain 2": ["draft=dflash", "draft.dflash.qk_gain=2"],
    "dflash qk gain 1.5": ["draft=dflash", "draft.dflash.qk_gain=1.5"],
    # as many key/value heads as query heads: a block row reads 576 value dimensions, not 192
    "dflash 9 kv heads": ["draft=dflash", "draft.dflash.kv_heads=9"],
    "dflash 9 kv heads gamma 1": ["draft=dflash", "draft.dflash.kv_heads=9", "draft.dflash.loss_gamma=1"],
    "dflash 2 layers 9 kv heads gamma 1": [
        "draft=dflash",
        "draft.dflash.num_decoder_layers=2",
        "draft.dflash.kv_heads=9",
        "draft.dflash.loss_gamma=1",
    ],
    # the first layer starts reading the anchor row: its logit this many nats above the others
    "dflash anchor prior 5": ["draft=dflash", "draft.dflash.loss_gamma=7", "draft.dflash.anchor_prior=5"],
    "dflash anchor prior 7": ["draft=dflash", "draft.dflash.loss_gamma=7", "draft.dflash.anchor_prior=7"],
    # the output norm's starting gain: near-uniform first drafts instead of confident wrong ones
    "dflash out gain 0.1": [
        "draft=dflash",
        "draft.dflash.loss_gamma=7",
        "draft.dflash.anchor_prior=0",
        "draft.dflash.out_gain=0.1",
    ],
    "dflash out gain 0.03": [
        "draft=dflash",
        "draft.dflash.loss_gamma=7",
        "draft.dflash.anchor_prior=0",
        "draft.dflash.out_gain=0.03",
    ],
    "dflash out gain 0.1 anchor prior 5": [
        "draft=dflash",
        "draft.dflash.loss_gamma=7",
        "draft.dflash.out_gain=0.1",
        "draft.dflash.anchor_prior=5",
    ],
    "dflash qk gain 3": ["draft=dflash", "draft.dflash.qk_gain=3"],
    "dflash lr 3e-3": ["draft=dflash", "train.lr=3e-3"],
    "dflash lr 2e-3": ["draft=dflash", "train.lr=2e-3"],
    "dflash gamma 2": ["draft=dflash", "draft.dflash.loss_gamma=2", "draft.dflash.anchor_prior=0"],
    # the reference's loss decay and start (draft=dflash's defaults before the two rows below won)
    "dflash reference start": ["draft=dflash", "draft.dflash.loss_gamma=7", "draft.dflash.anchor_prior=0"],
    # the loss on the first block positions: acceptance is a prefix, so position 1 gates the rest
    "dflash gamma 1": ["draft=dflash", "draft.dflash.loss_gamma=1", "draft.dflash.anchor_prior=0"],
    "dflash gamma 1 anchor prior 5": [
        "draft=dflash",
        "draft.dflash.loss_gamma=1",
        "draft.dflash.anchor_prior=5",
    ],
    "dflash gamma 1 anchor prior 7": [
        "draft=dflash",
        "draft.dflash.loss_gamma=1",
        "draft.dflash.anchor_prior=7",
    ],
    "dflash gamma 2 anchor prior 7": [
        "draft=dflash",
        "draft.dflash.loss_gamma=2",
        "draft.dflash.anchor_prior=7",
    ],
    "dflash gamma 0.5": ["draft=dflash", "draft.dflash.loss_gamma=0.5", "draft.dflash.anchor_prior=0"],
    "dflash gamma 0.5 anchor prior 7": [
        "draft=dflash",
        "draft.dflash.loss_gamma=0.5",
        "draft.dflash.anchor_prior=7",
    ],
    "dflash gamma 0.5 anchor prior 10": [
        "draft=dflash",
        "draft.dflash.loss_gamma=0.5",
        "draft.dflash.anchor_prior=10",
    ],
    "dflash gamma 0.25 anchor prior 7": [
        "draft=dflash",
        "draft.dflash.loss_gamma=0.25",
        "draft.dflash.anchor_prior=7",
    ],
    # each block's positions weighed by how likely its chain reaches them (speculators' D-PACE)
    "dflash dpace": ["draft=dflash", "draft.dflash.position_weights=dpace"],
    "dflash dpace alpha 0.2": [
        "draft=dflash",
        "draft.dflash.position_weights=dpace",
        "draft.dflash.dpace_alpha=0.2",
    ],
    "dflash dpace 2 layers": [
        "draft=dflash",
        "draft.dflash.position_weights=dpace",
        "draft.dflash.num_decoder_layers=2",
    ],
    "dflash 4 passes lr 3e-3": ["draft=dflash", "bench.epochs=4", "train.lr=3e-3"],
    # a share of the training blocks read their own rows only: the anchor is all they can use
    "dflash context dropout 0.5": ["draft=dflash", "draft.dflash.context_dropout=0.5"],
    # almost every block blind: what the anchor row alone teaches block position 1
    "dflash anchor only": ["draft=dflash", "draft.dflash.context_dropout=0.99"],
    # the anchor first: a third of the run's 89 steps blind, then the whole context
    "dflash blind 30 steps": ["draft=dflash", "draft.dflash.blind_steps=30"],
    # one row per optimizer step instead of four packed: four times the updates per token
    "dflash micro-batch 1": ["draft=dflash", "train.micro_batch_size=1"],
    "dflash micro-batch 1 qk gain 1.5": [
        "draft=dflash",
        "train.micro_batch_size=1",
        "draft.dflash.qk_gain=1.5",
    ],
    # P-EAGLE's own levers on draft=peagle's recipe: the group's depth, how many anchors each
    # deeper depth keeps (conditional drop), and a start from the EAGLE-3 row's drafter (trained
    # on the same data first, so that row costs its own training on top)
    "peagle": ["draft=peagle"],
    "peagle 4 depths": ["draft=peagle", "draft.peagle.num_depths=4"],
    "peagle 12 depths": ["draft=peagle", "draft.peagle.num_depths=12"],
    "peagle ratio 0.5": ["draft=peagle", "draft.peagle.down_sample_ratio=0.5"],
    "peagle ratio 0.9": ["draft=peagle", "draft.peagle.down_sample_ratio=0.9"],
    "peagle no drop": [
        "draft=peagle",
        "draft.peagle.down_sample_ratio=1",
        "draft.peagle.down_sample_ratio_min=1",
    ],
    "peagle from eagle3": ["draft=peagle", "draft.peagle.init_from_eagle3=@eagle3"],
    # EAGLE-3's levers on the same data
    "eagle3 regenerated": ["bench.data=regenerated"],
    "eagle3 2 passes": ["bench.epochs=2"],
    "eagle3 ttt 2": ["draft.eagle.ttt_steps=2"],
    "eagle3 lr 6e-4": ["train.lr=6e-4"],
    "eagle3 micro-batch 1": ["train.micro_batch_size=1"],
}
# Every DFlash row but "dflash" was measured on one layer with γ 0.5, draft=dflash's defaults
# until then: each keeps that base (its own values win), so its figures reproduce.
ONE_LAYER = {"draft.dflash.num_decoder_layers": "1", "draft.dflash.loss_gamma": "0.5"}


def on_one_layer(row: list[str]) -> list[str]:
    """``row`` (``draft=dflash`` first) on the one-layer recipe: the base's keys it does not set
    come after ``draft=dflash``, then the row's own overrides."""
    keys = {o.split("=", 1)[0] for o in row}
    return [row[0], *(f"{k}={v}" for k, v in ONE_LAYER.items() if k not in keys), *row[1:]]


ABLATIONS.update(
    {
        name: on_one_layer(row)
        for name, row in ABLATIONS.items()
        if row[:1] == ["draft=dflash"] and name != "dflash"
    }
)
# the drafter's own tree verified at every step, as overrides
DRAFTER_ONLY = decode_overrides(ALONE)
# "<row> drafter only" decodes <row>'s drafter so (it trains nothing of its own)
ABLATIONS.update(
    {
        f"{row} drafter only": [*ABLATIONS[row], *DRAFTER_ONLY]
        for row in (
            "eagle3",
            "dflash",
            "dflash 1 layer",
            "dflash 2 layers gamma 2",
            "dflash 3 layers gamma 1",
            "dflash 2 layers gamma 1 64 anchors",
            "dflash regenerated",
            "dflash reference start",
            "dflash anchor prior 5",
            "dflash anchor prior 7",
            "dflash out gain 0.1",
            "dflash gamma 2",
            "dflash gamma 1",
            "dflash gamma 1 anchor prior 7",
            "dflash 2 layers",
            "dflash 2 layers gamma 1",
            "dflash 128 anchors",
            "dflash every anchor",
            "dflash block 8",
            "dflash block 8 every anchor",
            "dflash block 4 every anchor",
            "dflash qk gain 2",
            "dflash dpace",
            "dflash dpace alpha 0.2",
            "dflash dpace 2 layers",
            "dflash gamma 0.5 anchor prior 7",
            "dflash context dropout 0.5",
            "dflash anchor only",
            "dflash blind 30 steps",
            "dflash micro-batch 1",
            "dflash micro-batch 1 qk gain 1.5",
            "dflash qk gain 1.5",
            "dflash 9 kv heads",
            "dflash 9 kv heads gamma 1",
            "dflash 2 layers 9 kv heads gamma 1",
            "eagle3 regenerated",
            "eagle3 micro-batch 1",
            "peagle",
            "peagle 4 depths",
            "peagle 12 depths",
            "peagle ratio 0.5",
            "peagle ratio 0.9",
            "peagle no drop",
            "peagle from eagle3",
        )
    }
)
# "<row> full tree" decodes <row>'s drafter with the lookup branch but no planner: the whole tree
# verified at every step (acceptance, not speed)
FULL_TREE = ["decode.cost_aware=false"]
ABLATIONS.update(
    {
        f"{row} full tree": [*ABLATIONS[row], *FULL_TREE]
        for row in ("eagle3", "dflash", "dflash gamma 1 anchor prior 7", "dflash 2 layers gamma 1")
    }
)
# the data a row trains on: the teacher-forced cache, or the target's own regenerated answers
# (the distilled cache, ``bench.distill_prompts`` of them)
ROW_DATA = ("teacher", "regenerated")
