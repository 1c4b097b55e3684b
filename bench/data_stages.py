"""Stages 1 and 2 of the bench: the data its drafters train on.

**distill**: the target answers prompts greedily (the embedded train split, plus GSM8K train and
CodeAlpaca when the optional ``bench.shared_data`` folder exists) and, optionally, prompts it
wrote itself; ``data.distill`` is resumable row by row. **features**: one offline feature cache
of the distilled chats holding every layer any drafter reads (the union of their training layers,
:func:`~draftheads.bench.teacher_stages.cache_layers`), so every drafter trains from the same cache.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from draftheads.bench import teacher_stages
from draftheads.bench.stages import compose, done, log, mark_done
from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.schema import BenchConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def distill_prompts(cfg: BenchArgs, b: BenchConfig) -> list:
    """A fixed, shuffled, breadth-first sample of training prompts (never held-out ones)."""
    from draftheads.data.prompts import prompts_from_config

    shared = Path(b.shared_data) if b.shared_data else None
    use_shared = shared is not None and shared.is_dir()
    data_cfg = compose(["data=broad"] if use_shared else ["data=embedded"]).data
    if use_shared:  # point the broad mixture at the configured shared folder
        for comp in data_cfg.mixture:
            if str(comp.get("path", "")).startswith("../shared/data"):
                comp["path"] = str(shared / str(comp["path"]).removeprefix("../shared/data/"))
    prompts = prompts_from_config(data_cfg, "train")
    random.Random(0).shuffle(prompts)
    return prompts[: b.distill_prompts]


def stage_distill(
    cfg: BenchArgs, b: BenchConfig, target: PreTrainedModel, tok: PreTrainedTokenizerBase
) -> list[Path]:
    """The distilled chats' folders: the sampled prompts' answers, then the target-written ones'."""
    from draftheads.data.distill.run import distill
    from draftheads.data.self_prompts import self_prompts
    from draftheads.decode import backend
    from draftheads.decode.batched import batched_generate

    runner = partial(backend.running, cfg.data.distill.backend)
    fast = batched_generate(target)  # drops finished rows from the batch (decode/batched.py)
    out = Path(b.out_dir) / "distill"
    d = replace(
        cfg.data.distill,
        temperature=0.0,
        max_new_tokens=b.distill_new_tokens,
        batch_size=b.distill_batch_size,
    )
    dirs = [out / "prompts"]
    made = {"prompts": b.distill_prompts, "new_tokens": b.distill_new_tokens}
    if not done(dirs[0], made):
        log(f"distill: {b.distill_prompts} prompts, greedy, {b.distill_new_tokens} new tokens")
        t0 = time.perf_counter()
        distill(
            target, tok, distill_prompts(cfg, b), replace(d, out_dir=str(dirs[0])), decode=fast, runner=runner
        )
        mark_done(dirs[0], {"seconds": time.perf_counter() - t0}, settings=made)
    if b.self_prompts:
        dirs.append(out / "self")
        made = {"self_prompts": b.self_prompts, "new_tokens": b.distill_new_tokens}
        if not done(dirs[1], made):
            log(f"distill: {b.self_prompts} target-written prompts, then their answers")
            t0 = time.perf_counter()
            sd = replace(d, out_dir=str(dirs[1]), source="self", self_prompts=b.self_prompts)
            prompts, stats = self_prompts(target, tok, sd, decode=fast, runner=runner)
            log(f"target-written prompts: {json.dumps(stats)}")
            distill(target, tok, prompts, sd, source="self", decode=fast, runner=runner)
            mark_done(dirs[1], {**stats, "seconds": time.perf_counter() - t0}, settings=made)
    return dirs


def stage_features(
    cfg: BenchArgs,
    b: BenchConfig,
    target: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    data_dirs: list[Path],
    layers: list[int],
) -> Path:
    """The one feature cache of the chats in ``data_dirs``, with the target ``layers`` every drafter
    reads (:func:`~draftheads.bench.teacher_stages.cache_layers`)."""
    import datasets

    from draftheads.data.cache.build import build_feature_cache
    from draftheads.data.prepare import prepare_dataset

    out = Path(b.out_dir) / "features"
    # beside a teacher-forced cache, the same label columns (top-k), so the two train as one
    topk = b.topk if b.teacher_tokens else 0
    made = {"data": [d.name for d in data_dirs], "topk": topk, "layers": list(layers)}
    if done(out, made):
        return out
    parts = []
    for d in data_dirs:
        ds, report = prepare_dataset(replace(cfg.data, path=str(d), mixture=[], max_length=512), tok, "train")
        log(f"features: {d.name}: {len(ds)} rows, {sum(map(sum, ds['loss_mask']))} answer tokens")
        parts.append(ds.select_columns(["input_ids", "loss_mask"]))
    ds = datasets.concatenate_datasets(parts)
    log(f"features: {len(ds)} rows, layers {layers}")
    t0 = time.perf_counter()
    build_feature_cache(target, tok, ds, out, layers, dtype="bfloat16", topk=topk, batch_tokens=2048)
    teacher_stages.write_answer_tokens(out, [sum(m) for m in ds["loss_mask"]])
    answer = sum(map(sum, ds["loss_mask"]))
    mark_done(out, {"rows": len(ds), "answer_tokens": answer, "seconds": time.perf_counter() - t0}, made)
    return out
