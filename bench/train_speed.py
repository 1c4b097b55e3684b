"""Training throughput on this machine (a benchmark, not a test)::

    draftheads train-speed speed.cache=outputs/bench/teacher draft=<group> speed.tokens=8000 speed.steps=8

(``speed.pack=false`` pads every micro-batch to its longest row instead of packing it; a drafter
that reads fewer layers than the cache holds takes its own of them).

Trains ``speed.steps`` steps of the ``make bench`` recipe for one drafter on the first
``speed.tokens`` answer tokens of an offline feature cache (as ``draftheads bench`` does), then
prints the per-step losses and the mean training tokens/s after the first step (which pays
one-off costs). For a drafter whose objective counts its FLOPs (its bench row's ``flops``) it also prints the matmul FLOPs per row
token of those steps, as its objective counts them: they depend on the anchors
drawn and on how the micro-batches are laid out, so they are measured, not assumed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from draftheads.bench.stages import compose, drafter_rows, target_group, train_overrides
from draftheads.conf.commands.args import TrainSpeedArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema.bench_drafters import BENCH_DRAFTERS, bench_drafter, bench_drafter_for


def drafter_name(args: TrainSpeedArgs) -> str:
    """The bench drafter whose recipe trains ``args.draft`` (its kind and version)."""
    d = bench_drafter_for(args.draft)
    if d is None:
        raise UserError(
            f"draft.kind={args.draft.kind} has no bench recipe; use one of "
            f"{', '.join(o for b in BENCH_DRAFTERS.values() for o in b.draft)}"
        )
    return d.name


def train_speed(args: TrainSpeedArgs) -> None:
    """``draftheads train-speed``: losses and training tokens/s of a few bench-recipe steps."""
    from draftheads.data.cache.read import FeatureCache
    from draftheads.train.metrics import read_metrics
    from draftheads.train.recipe import train

    cache = Path(args.speed.cache)
    if not (cache / "manifest.json").is_file():
        raise UserError(
            f"speed.cache={cache} is not a feature cache; build one with `draftheads features` or `make bench`"
        )
    name = drafter_name(args)
    with tempfile.TemporaryDirectory() as out:
        cfg = compose(
            [
                f"target={target_group(args)}",
                *train_overrides(name, Path(out), args.speed.steps),
                "train.progress=false",
                "train.log_every=1",
                f"train.pack_micro_batches={str(args.speed.pack).lower()}",
            ]
        )
        cfg.target = args.target
        fp = FeatureCache(cache).fingerprint
        rows = drafter_rows(bench_drafter(name), cache, fp.hidden_size, fp.num_layers, args.speed.tokens)
        train(cfg, rows=rows)
        logged = [r for r in read_metrics(Path(out)) if "tokens_per_s" in r]
    rates = [r["tokens_per_s"] for r in logged[1:]] or [logged[0]["tokens_per_s"]]
    print("losses:", " ".join(f"{r['loss']:.3f}" for r in logged))
    print(f"{name}: {sum(rates) / len(rates):.0f} training tokens/s over {len(logged)} steps")
    if flops := bench_drafter(name).flops:
        gflop = sum(r["train/cost/gflop"] * r["tokens"] for r in logged) / sum(r["tokens"] for r in logged)
        print(f"{name}: {gflop:.4f} GFLOP of matmuls per row token ({flops})")
