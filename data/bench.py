"""Measure the pipeline's throughput on this machine (not a test): ``python -m draftheads.data.bench``.

Prints tokens/s of tokenization + masking (``prepare_dataset`` on the embedded set) and of
feature extraction (``build_feature_cache`` over the first ``--feature-tokens`` tokens of it),
both with the configured target (default: the embedded SmolLM2).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from draftheads.conf.schema.data import DataConfig
from draftheads.conf.schema.heads import TargetConfig
from draftheads.data.cache import build_feature_cache
from draftheads.data.prepare import prepare_dataset
from draftheads.heads.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--feature-tokens", type=int, default=20000)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_target(TargetConfig())
    t = time.perf_counter()
    ds, report = prepare_dataset(DataConfig(max_length=512), tok)
    dt = time.perf_counter() - t
    print(
        f"tokenize+mask: {len(ds)} rows, {report.tokens} tokens in {dt:.1f} s = {report.tokens / dt:,.0f} tokens/s"
    )
    n, total = 0, 0
    while n < len(ds) and total < args.feature_tokens:
        total += len(ds[n]["input_ids"])
        n += 1
    subset = ds.select(range(n))
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        build_feature_cache(
            model,
            tok,
            subset,
            out,
            [model.config.num_hidden_layers],
            dtype=args.dtype,
            batch_tokens=args.batch_tokens,
            show_progress=False,
        )
        dt = time.perf_counter() - t
    print(
        f"features (last layer, {args.dtype}, batch_tokens {args.batch_tokens}, {args.threads} threads): "
        f"{n} rows, {total} tokens in {dt:.1f} s = {total / dt:,.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
