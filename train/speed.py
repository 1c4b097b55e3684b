"""Training throughput on this machine (a benchmark, not a test)::

    python -m draftheads.train.speed --cache outputs/bench/features --draft eagle3 --tokens 8000 --steps 8

Trains ``--steps`` steps of the ``make bench`` recipe for one drafter on the first ``--tokens``
answer tokens of an offline feature cache (as ``draftheads bench`` does), then prints the
per-step losses and the mean training tokens/s after the first step (which pays one-off costs).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from draftheads.decode.bench import compose, load_rows, train_overrides
from draftheads.train.metrics import read_metrics
from draftheads.train.recipe import train


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, help="an offline feature cache (draftheads features / bench)")
    ap.add_argument("--draft", default="eagle3", choices=["medusa", "eagle", "eagle3"])
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--target", default="smollm2", help="target config group (smollm2, tiny-llama, ...)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as out:
        cfg = compose(
            [
                f"target={a.target}",
                *train_overrides(a.draft, Path(out), a.steps),
                "train.progress=false",
                "train.log_every=1",
            ]
        )
        which = "last" if a.draft == "medusa" else "all"
        rows = load_rows(Path(a.cache), _hidden(a.cache), which, a.tokens)
        train(cfg, rows=rows)
        logged = [r for r in read_metrics(Path(out)) if "tokens_per_s" in r]
    rates = [r["tokens_per_s"] for r in logged[1:]] or [logged[0]["tokens_per_s"]]
    print("losses:", " ".join(f"{r['loss']:.3f}" for r in logged))
    print(f"{a.draft}: {sum(rates) / len(rates):.0f} training tokens/s over {len(logged)} steps")


def _hidden(cache: str) -> int:
    """The target's hidden size, from the cache's fingerprint."""
    from draftheads.data.cache import FeatureCache

    return FeatureCache(cache).fingerprint.hidden_size


if __name__ == "__main__":
    main()
