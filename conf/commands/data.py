"""``draftheads data | distill | features``: the data pipeline's commands."""

from __future__ import annotations

import json
import sys
from functools import partial

from draftheads.conf.commands.args import DataArgs, DistillArgs, FeaturesArgs
from draftheads.conf.errors import UserError
from draftheads.data.outdir import claimed, guard_out_dir

TRAINED_OPEN, TRAINED_CLOSE = "\u27e6", "\u27e7"


def mark_trained(tokenizer, input_ids: list[int], loss_mask: list[int]) -> str:
    """The decoded row with every run of trained tokens wrapped in ⟦ ⟧."""
    parts, run, cur = [], [], None
    for tok, m in zip(input_ids, loss_mask):
        if cur is not None and m != cur:
            parts.append((cur, tokenizer.decode(run)))
            run = []
        run.append(tok)
        cur = m
    if run:
        parts.append((cur, tokenizer.decode(run)))
    return "".join(f"{TRAINED_OPEN}{t}{TRAINED_CLOSE}" if m else t for m, t in parts)


def data(cfg: DataArgs) -> None:
    """Prepare the configured data set; print counts, skip reasons and ``data.show`` marked examples.

    ``out_dir=DIR`` saves the rows (``datasets.save_to_disk``) into a new or empty folder, or
    over a data set saved there before (:func:`draftheads.data.outdir.guard_out_dir`), refused
    before any work.
    """
    from draftheads.data.prepare import prepare_dataset
    from draftheads.heads.target.load import load_tokenizer

    if cfg.out is not None:
        guard_out_dir(cfg.out, "data", "out_dir")

    tok = load_tokenizer(cfg.target)
    ds, report = prepare_dataset(cfg.data, tok, "train")
    print(report.format())
    for i in range(min(cfg.data.show, len(ds))):
        row = ds[i]
        name = row.get("id") or f"packed row {i}"
        print(
            f"\n--- example {i}: {name} [{row['source']}], {len(row['input_ids'])} tokens, "
            f"{sum(row['loss_mask'])} trained (inside {TRAINED_OPEN} {TRAINED_CLOSE}) ---"
        )
        print(mark_trained(tok, row["input_ids"], row["loss_mask"]))
    if cfg.out is not None:
        with claimed(cfg.out, "data", "out_dir"):
            ds.save_to_disk(cfg.out)
        print(f"saved {len(ds)} rows to {cfg.out}")


def drafter_layers(cfg: FeaturesArgs, num_layers: int) -> list[int]:
    """The target layers the configured drafter reads (what the feature cache must store)."""
    if cfg.data.features.layers:
        return list(cfg.data.features.layers)
    return cfg.draft.training_layers(num_layers)


def features(cfg: FeaturesArgs) -> None:
    """Build the offline feature cache of the configured data set for the configured drafter."""
    from draftheads.data.cache.build import build_feature_cache
    from draftheads.data.prepare import prepare_dataset
    from draftheads.data.regenerated import check_regenerated_by
    from draftheads.heads.target.fingerprint import fingerprint
    from draftheads.heads.target.layers import decoder_layers
    from draftheads.heads.target.load import load_target

    if cfg.data.packing:
        raise UserError(
            "the feature cache needs unpacked rows (packed documents would attend to each other); "
            "set data.packing=false"
        )
    f = cfg.data.features
    guard_out_dir(f.out_dir, "features", "data.features.out_dir")
    model, tok = load_target(cfg.target)
    check_regenerated_by(cfg.data, fingerprint(model, tok))
    ds, report = prepare_dataset(cfg.data, tok, "train")
    print(report.format(), file=sys.stderr)
    with claimed(f.out_dir, "features", "data.features.out_dir"):
        manifest = build_feature_cache(
            model,
            tok,
            ds,
            f.out_dir,
            drafter_layers(cfg, len(decoder_layers(model))),
            dtype=f.dtype,
            batch_tokens=f.batch_tokens,
            target_next=f.target_next,
            topk=f.topk,
            shard_mb=f.shard_mb,
        )
    print(
        f"feature cache: {manifest['num_rows']} rows, {manifest['num_tokens']} tokens, layers "
        f"{manifest['layers']} -> {f.out_dir}"
    )


def distill(cfg: DistillArgs) -> None:
    """Answer the configured prompts (or target-written ones) with the target; resumable."""
    from draftheads.data.distill.run import distill as run_distill
    from draftheads.data.prompts import prompts_from_config
    from draftheads.data.self_prompts import self_prompts
    from draftheads.decode import backend
    from draftheads.heads.target.load import load_target

    d = cfg.data.distill
    if d.source not in ("data", "self"):
        raise UserError(f"data.distill.source={d.source} is unknown; use data (answer data.path) or self")
    guard_out_dir(d.out_dir, "distill", "data.distill.out_dir")
    model, tok = load_target(cfg.target)
    from draftheads.data.distill.generate import decoder_generate

    if d.heads:
        from draftheads.decode import SpeculativeGenerator
        from draftheads.heads import Drafter

        drafter = Drafter.from_pretrained(d.heads, target=model, tokenizer=tok, revision=cfg.revision)
        generate = decoder_generate(model, tok, SpeculativeGenerator(model, drafter, tokenizer=tok).generate)
    else:  # plain batched generation that drops finished rows from the batch
        from draftheads.decode.batched import batched_generate

        generate = decoder_generate(model, tok, batched_generate(model))
    runner = partial(backend.running, d.backend)
    with claimed(d.out_dir, "distill", "data.distill.out_dir"):  # one distillation writes there at a time
        if d.source == "self":
            prompts, stats = self_prompts(model, tok, d, generate=generate, runner=runner)
            print(f"target-written prompts: {json.dumps(stats)}")
        else:
            prompts = prompts_from_config(cfg.data, "train")
            if cfg.data.max_rows is not None:
                prompts = prompts[: cfg.data.max_rows]
        out = run_distill(model, tok, prompts, d, generate=generate, source=d.source, runner=runner)
    print(
        f"distilled {len(prompts)} prompts -> {out}; train on them with "
        f"`draftheads train data.path={out}` (format messages)"
    )
