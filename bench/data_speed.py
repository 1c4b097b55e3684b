"""The data pipeline's throughput on this machine (a benchmark, not a test)::

    draftheads data-speed speed.feature_tokens=3000 speed.batch_tokens=2048
    draftheads data-speed speed.feature_tokens=30000 speed.batch_tokens=2048 speed.topk=64
    draftheads data-speed speed.feature_tokens=0 speed.distill_prompts=96

Prints tokens/s of tokenisation + masking (``prepare_dataset`` on the configured data, the
embedded set by default) and of feature extraction (``build_feature_cache`` over the first
``speed.feature_tokens`` tokens of it), both with the configured target: the last layer, or with
``speed.topk`` the bench's row base's training layers and the target's top-k at the answer
positions (the bench's teacher-forced cache). With ``speed.distill_prompts``, also new tokens/s
of greedy distillation through the decoder's batched loop (``decode/batched.py``, what
``draftheads distill`` runs) and through transformers' ``generate``, and the share of answers
the two give identically.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from draftheads.conf.commands.args import DataSpeedArgs
from draftheads.conf.schema.bench_drafters import row_base


def data_speed(args: DataSpeedArgs) -> None:
    """``draftheads data-speed``: one line for tokenising + masking, one for feature extraction."""
    from draftheads.data.cache.build import build_feature_cache
    from draftheads.data.prepare import prepare_dataset
    from draftheads.heads.target.load import load_target

    o = args.speed
    model, tok = load_target(args.target)
    t = time.perf_counter()
    ds, report = prepare_dataset(args.data, tok)
    dt = time.perf_counter() - t
    print(
        f"tokenize+mask: {len(ds)} rows, {report.tokens} tokens in {dt:.1f} s = {report.tokens / dt:,.0f} tokens/s"
    )
    if o.distill_prompts:
        distill_speed(model, tok, args)
    if not o.feature_tokens:
        return
    n, total = 0, 0
    while n < len(ds) and total < o.feature_tokens:
        total += len(ds[n]["input_ids"])
        n += 1
    # with top-k labels: the bench's row base's training layers, as its teacher-forced cache stores them
    L = model.config.num_hidden_layers
    layers = row_base().draft_config().training_layers(L) if o.topk else [L]
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        build_feature_cache(
            model,
            tok,
            ds.select(range(n)),
            out,
            layers,
            dtype=o.dtype,
            batch_tokens=o.batch_tokens,
            topk=o.topk,
            show_progress=False,
        )
        dt = time.perf_counter() - t
    what = f"layers {layers} + top-{o.topk} logits" if o.topk else "last layer"
    print(
        f"features ({what}, {o.dtype}, batch_tokens {o.batch_tokens}, {torch.get_num_threads()} threads): "
        f"{n} rows, {total} tokens in {dt:.1f} s = {total / dt:,.0f} tokens/s"
    )


def distill_speed(model, tok, args: DataSpeedArgs) -> None:
    """Greedy distillation of the first ``speed.distill_prompts`` training prompts, once per loop."""
    from draftheads.data.distill.generate import decoder_generate, hf_generate
    from draftheads.data.distill.run import distill
    from draftheads.data.distill.shards import shard_rows
    from draftheads.data.prompts import prompts_from_config
    from draftheads.decode import backend
    from draftheads.decode.batched import batched_generate

    o = args.speed
    prompts = prompts_from_config(args.data, "train")[: o.distill_prompts]
    runner = partial(backend.running, args.data.distill.backend)
    loops = {
        "batched loop (decode/batched.py)": decoder_generate(model, tok, batched_generate(model)),
        "transformers generate": hf_generate(model, tok),
    }
    answers = []
    for name, generate in loops.items():
        with tempfile.TemporaryDirectory() as out:
            cfg = replace(
                args.data.distill,
                out_dir=out,
                temperature=0.0,
                batch_size=o.distill_batch_size,
                max_new_tokens=o.distill_new_tokens,
            )
            t = time.perf_counter()
            distill(model, tok, prompts, cfg, generate=generate, show_progress=False, runner=runner)
            dt = time.perf_counter() - t
            rows = shard_rows(Path(out))
        ids = {r["id"]: r["answer_ids"] for r in rows}
        new = sum(len(a) for turns in ids.values() for a in turns)
        answers.append(ids)
        print(
            f"distill, {name} ({args.data.distill.backend} backend, batch {o.distill_batch_size}, "
            f"{torch.get_num_threads()} threads): {len(rows)} prompts, {new} new tokens in {dt:.1f} s "
            f"= {new / dt:,.0f} new tokens/s"
        )
    same = sum(answers[0][k] == answers[1].get(k) for k in answers[0])
    print(f"distill: {same} of {len(answers[0])} greedy answers identical between the two loops")
