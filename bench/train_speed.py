"""Training throughput on this machine (a benchmark, not a test)::

    draftheads train-speed speed.cache=outputs/bench/teacher draft=eagle3 speed.tokens=8000 speed.steps=8

(``speed.pack=false`` pads every micro-batch to its longest row instead of packing it;
``draft=dflash`` reads EAGLE-3's three input layers of the same cache).

Trains ``speed.steps`` steps of the ``make bench`` recipe for one drafter on the first
``speed.tokens`` answer tokens of an offline feature cache (as ``draftheads bench`` does), then
prints the per-step losses and the mean training tokens/s after the first step (which pays
one-off costs). For DFlash it also prints the matmul FLOPs per row token of those steps, as
its objective counts them (``train.objectives.dflash_train_flops``): they depend on the anchors
drawn and on how the micro-batches are laid out, so they are measured, not assumed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from draftheads.bench.stages import compose, load_rows, target_group, train_overrides
from draftheads.conf.commands.args import TrainSpeedArgs
from draftheads.conf.errors import UserError


def drafter_name(args: TrainSpeedArgs) -> str:
    """``medusa``, ``eagle``, ``eagle3`` or ``dflash``: the bench recipe that trains ``args.draft``."""
    if args.draft.kind in ("medusa", "dflash"):
        return args.draft.kind
    return "eagle3" if args.draft.version == 3 else "eagle"


def train_speed(args: TrainSpeedArgs) -> None:
    """``draftheads train-speed``: losses and training tokens/s of a few bench-recipe steps."""
    from draftheads.data.cache import FeatureCache
    from draftheads.train.metrics import read_metrics
    from draftheads.train.recipe import train

    cache = Path(args.speed.cache)
    if not (cache / "manifest.json").is_file():
        raise UserError(
            f"speed.cache={cache} is not a feature cache; build one with `draftheads features` or `make bench`"
        )
    kind = drafter_name(args)
    with tempfile.TemporaryDirectory() as out:
        cfg = compose(
            [
                f"target={target_group(args)}",
                *train_overrides(kind, Path(out), args.speed.steps),
                "train.progress=false",
                "train.log_every=1",
                f"train.pack_micro_batches={str(args.speed.pack).lower()}",
            ]
        )
        cfg.target = args.target
        fp = FeatureCache(cache).fingerprint
        layers = cfg.draft.training_layers(fp.num_layers) if kind == "dflash" else None
        rows = load_rows(
            cache, fp.hidden_size, "last" if kind == "medusa" else "all", args.speed.tokens, layers
        )
        train(cfg, rows=rows)
        logged = [r for r in read_metrics(Path(out)) if "tokens_per_s" in r]
    rates = [r["tokens_per_s"] for r in logged[1:]] or [logged[0]["tokens_per_s"]]
    print("losses:", " ".join(f"{r['loss']:.3f}" for r in logged))
    print(f"{kind}: {sum(rates) / len(rates):.0f} training tokens/s over {len(logged)} steps")
    if kind == "dflash":
        gflop = sum(r["train/cost/gflop"] * r["tokens"] for r in logged) / sum(r["tokens"] for r in logged)
        print(
            f"dflash: {gflop:.4f} GFLOP of matmuls per row token (forward and backward: fc, context keys and "
            "values, the block layers and their attention, the draft head on the counted positions)"
        )
