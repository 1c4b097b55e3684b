"""The data pipeline's throughput on this machine (a benchmark, not a test)::

    draftheads data-speed speed.feature_tokens=3000 speed.batch_tokens=2048

Prints tokens/s of tokenisation + masking (``prepare_dataset`` on the configured data, the
embedded set by default) and of feature extraction (``build_feature_cache`` over the first
``speed.feature_tokens`` tokens of it), both with the configured target.
"""

from __future__ import annotations

import tempfile
import time

import torch

from draftheads.conf.commands.args import DataSpeedArgs


def data_speed(args: DataSpeedArgs) -> None:
    """``draftheads data-speed``: one line for tokenising + masking, one for feature extraction."""
    from draftheads.data.cache import build_feature_cache
    from draftheads.data.prepare import prepare_dataset
    from draftheads.heads.target import load_target

    o = args.speed
    model, tok = load_target(args.target)
    t = time.perf_counter()
    ds, report = prepare_dataset(args.data, tok)
    dt = time.perf_counter() - t
    print(
        f"tokenize+mask: {len(ds)} rows, {report.tokens} tokens in {dt:.1f} s = {report.tokens / dt:,.0f} tokens/s"
    )
    n, total = 0, 0
    while n < len(ds) and total < o.feature_tokens:
        total += len(ds[n]["input_ids"])
        n += 1
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        layers = [model.config.num_hidden_layers]
        build_feature_cache(
            model,
            tok,
            ds.select(range(n)),
            out,
            layers,
            dtype=o.dtype,
            batch_tokens=o.batch_tokens,
            show_progress=False,
        )
        dt = time.perf_counter() - t
    print(
        f"features (last layer, {o.dtype}, batch_tokens {o.batch_tokens}, {torch.get_num_threads()} threads): "
        f"{n} rows, {total} tokens in {dt:.1f} s = {total / dt:,.0f} tokens/s"
    )
