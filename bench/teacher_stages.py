"""The bench's teacher-forced stages: one feature cache of text the target did not write, and
the streamed main drafters (``BenchDrafter.streamed``) trained on it from the disk.

Every stage is a folder under ``bench.out_dir`` marked done when finished; training runs save
checkpoints, so a rerun skips finished stages and continues an interrupted one. The cache records
each shard's answer tokens (:data:`ANSWER_TOKENS`), so that a maintainer's study (``bench/lab/``
in the repository) can cut views of its first shards without reading it.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.bench_drafters import BenchDrafter, bench_drafter, bench_drafter_for, row_base

ANSWER_TOKENS = "answer_tokens.json"  # per shard of the teacher cache: trained (answer) tokens


def cache_layers(drafters: list[str], num_layers: int, rows: Sequence[list[str]] = ()) -> list[int]:
    """Every target layer that the bench's drafters read, and the training overrides of ``rows``
    (a study's extra rows, on the row base's recipe unless they name a ``draft``): the one feature
    cache each data source gets holds their union, so every drafter and row trains from it."""
    from draftheads.bench.stages import compose

    base = row_base()
    layers: set[int] = set(base.draft_config().training_layers(num_layers))
    for extra in [*(bench_drafter(name).row() for name in drafters), *rows]:
        draft = [o for o in extra if o.startswith("draft")]
        named = any(o.startswith("draft=") for o in draft)
        layers.update(compose([*([] if named else base.draft), *draft]).draft.training_layers(num_layers))
    return sorted(layers)


def row_drafter(extra: Sequence[str]) -> BenchDrafter:
    """The bench drafter whose recipe a row's overrides build on: the one that trains the kind of
    the draft group the row names (a row naming none, or a kind without one: the row base)."""
    from draftheads.bench.stages import compose

    group = [o for o in extra if o.startswith("draft=")][-1:]
    return (bench_drafter_for(compose(group).draft) if group else None) or row_base()


def decode_with(decode, overrides: list[str]):
    """``decode`` (a DecodeConfig) with ``decode.key=value`` overrides applied and checked."""
    from omegaconf import OmegaConf

    given = OmegaConf.from_dotlist([o.removeprefix("decode.") for o in overrides])
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(decode), given))


# ---- the teacher-forced cache --------------------------------------------------------------
def interleave(lengths: list[int], seed: int) -> list[tuple[int, int]]:
    """``(part, row)`` pairs: each part shuffled, then merged in proportion, so that every prefix
    holds each part's share of the rows."""
    rng = random.Random(seed)
    keyed = []
    for k, n in enumerate(lengths):
        order = list(range(n))
        rng.shuffle(order)
        keyed += [((j + 0.5) / n, k, row) for j, row in enumerate(order)]
    return [(k, row) for _, k, row in sorted(keyed)]


def teacher_dataset(cfg: BenchArgs, b: BenchConfig, tok):
    """Distinct teacher-forced rows (``data=teacher``), interleaved across components and cut at
    ``bench.teacher_tokens`` answer tokens. Distilled answers get their own cache (see
    :func:`mixture`), so adding them never rebuilds this one."""
    import datasets

    from draftheads.bench.stages import compose, log
    from draftheads.data.prepare import absent, prepare_dataset

    data = replace(
        compose(["data=teacher", f"data.data_dir={b.shared_data}"]).data, max_rows=cfg.data.max_rows
    )
    comps = [dict(c) for c in data.mixture if c["name"] != "self"]
    parts = []
    for comp in comps:
        if absent(comp, data.data_dir):
            log(f"teacher: {comp['name']} left out ({comp['path']} absent)")
            continue
        ds, _ = prepare_dataset(replace(data, mixture=[{**comp, "weight": 1}]), tok, "train")
        parts.append(ds.select_columns(["input_ids", "loss_mask"]))
    order = interleave([len(p) for p in parts], 0)
    offsets = [sum(len(p) for p in parts[:k]) for k in range(len(parts))]
    picked, tokens = [], 0
    loss = [p["loss_mask"] for p in parts]
    for k, row in order:
        if tokens >= b.teacher_tokens:
            break
        picked.append(offsets[k] + row)
        tokens += sum(loss[k][row])
    return datasets.concatenate_datasets(parts).select(picked), tokens


def stage_teacher(cfg: BenchArgs, b: BenchConfig, target, tok, layers: list[int]) -> Path:
    """The feature cache of the teacher-forced rows: the target ``layers`` every drafter reads
    (:func:`cache_layers`) and the target's top-k."""
    from draftheads.bench.stages import done, log, mark_done
    from draftheads.data.cache.build import build_feature_cache

    out = Path(b.out_dir) / "teacher"
    made = {"teacher_tokens": b.teacher_tokens, "topk": b.topk, "max_rows": cfg.data.max_rows}
    made["layers"] = list(layers)
    if done(out, made):
        return out
    t0 = time.perf_counter()
    ds, tokens = teacher_dataset(cfg, b, tok)
    log(f"teacher: {len(ds)} rows, {tokens} distinct answer tokens, top-{b.topk} logits")
    build_feature_cache(
        target, tok, ds, out, made["layers"], topk=b.topk, shard_mb=b.shard_mb, batch_tokens=2048
    )
    write_answer_tokens(out, [sum(m) for m in ds["loss_mask"]])
    mark_done(out, {"rows": len(ds), "answer_tokens": tokens, "seconds": time.perf_counter() - t0}, made)
    return out


def write_answer_tokens(cache: Path, loss: list[int]) -> None:
    """Each shard's answer tokens beside the cache (what a study's views are cut by)."""
    from draftheads.data.cache.manifest import read_manifest

    shards = read_manifest(cache)["shards"]
    (cache / ANSWER_TOKENS).write_text(json.dumps([sum(loss[a:z]) for a, z in (s["rows"] for s in shards)]))


def mixture(b: BenchConfig, teacher: Path, distilled: Path) -> tuple[Path, dict]:
    """The streamed main drafters' data when distillation is on: the teacher-forced cache, then the
    self-distilled cache ``bench.distill_repeats`` times, as one view (nothing is copied).
    Returns the view and what it holds."""
    from draftheads.data.cache.manifest import read_manifest
    from draftheads.data.cache.views import combine_caches

    out = Path(b.out_dir) / "mixture"
    combine_caches([(teacher, 1), (distilled, b.distill_repeats)], out)
    d = read_manifest(distilled)["num_loss_tokens"]
    return out, {"distilled_tokens": d, "distill_repeats": b.distill_repeats}


# ---- training and τ ------------------------------------------------------------------------
def recipe(name: str, out: Path, extra: list[str], save_every: int) -> list[str]:
    """The bench's training overrides for the bench drafter ``name`` plus a row's ``extra`` (which win)."""
    from draftheads.bench.stages import train_overrides

    base = [
        o for o in train_overrides(name, out, 1) if not o.startswith(("train.max_steps", "train.save_every"))
    ]
    keys = {o.split("=", 1)[0] for o in extra}
    return [*(o for o in base if o.split("=", 1)[0] not in keys), *extra, f"train.save_every={save_every}"]


def train_on(cfg: BenchArgs, b: BenchConfig, target, cache: Path, out: Path, tokens: int, epochs: float,
             extra: list[str] = (), note: dict | None = None) -> dict:  # fmt: skip
    """One cached training run on the answer tokens of ``cache`` (streamed from disk by a drafter
    that can, see :func:`row_drafter`; else what it reads, ``BenchDrafter.reads``, in memory),
    ``epochs`` passes; returns its ``.done`` record (with ``note`` added to it)."""
    from draftheads.bench.stages import (
        compose,
        done,
        drafter_rows,
        drafter_settings,
        log,
        mark_done,
        target_group,
    )
    from draftheads.heads.target.fingerprint import fingerprint
    from draftheads.train.recipe import train

    d = row_drafter(extra)
    over = recipe(d.name, out, list(extra), b.save_every)
    over += [f"train.epochs={epochs:g}", "train.progress=false"]
    if d.offline:
        over += ["train.features=offline", f"train.feature_cache={cache}"]
    tcfg = compose([f"target={target_group(cfg)}", *over])
    made = {"answer_tokens": tokens, "epochs": round(epochs, 6), "overrides": list(extra), **(note or {})}
    made["draft"] = drafter_settings(tcfg)
    if done(out, made):
        return json.loads((out / ".done").read_text())
    H = target.config.hidden_size
    rows = None if d.offline else drafter_rows(d, cache, H, fingerprint(target).num_layers)
    log(f"train {out.name}: {tokens} answer tokens x {epochs:.2f} epochs {' '.join(extra)}")
    t0 = time.perf_counter()
    tcfg.target = cfg.target
    train(tcfg, rows=rows)
    info = {
        "seconds": time.perf_counter() - t0,
        "answer_tokens": tokens,
        "epochs": epochs,
        "overrides": list(extra),
        "eval": last_evaluation(out),
        **(note or {}),
    }
    mark_done(out, info, made)
    return info


def last_evaluation(out: Path) -> dict[str, float]:
    """The run's last held-out evaluation in ``metrics.jsonl`` (simulated τ, per-position
    accuracy), without the ``eval/`` prefix; empty when it evaluated nothing."""
    from draftheads.train.metrics import read_metrics

    rows = [r for r in read_metrics(out) if any(k.startswith("eval/") for k in r)] if out.is_dir() else []
    if not rows:
        return {}
    return {k.removeprefix("eval/"): v for k, v in rows[-1].items() if k.startswith("eval/")}


def heldout_tau(
    cfg: BenchArgs, b: BenchConfig, target, tok, heads: Path, decode: list[str] = (), out: Path | None = None
) -> dict:
    """τ of ``heads`` on the held-out prompts, decoded with ``decode`` overrides (cached in
    ``tau.json`` in ``out``, by default beside the drafter)."""
    from draftheads.bench.stages import eval_prompts
    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.prompting import encode_prompt
    from draftheads.heads import Drafter

    path = (out or heads.parent) / "tau.json"
    if path.is_file():
        return json.loads(path.read_text())
    drafter = Drafter.from_pretrained(heads, target=target, tokenizer=tok)
    gen = SpeculativeGenerator(target, drafter, tokenizer=tok, config=decode_with(cfg.decode, list(decode)))
    accepted, steps, drafted, draft_s, prompts = 0, 0, 0, 0.0, eval_prompts("heldout", b, tok)
    for p in prompts:
        ids = encode_prompt(tok, p.turns[0]).to(next(target.parameters()).device)
        gen.generate(ids, max_new_tokens=b.eval_new_tokens)
        s = gen.last_stats
        accepted += sum(s.accepted_lengths)
        steps += len(s.accepted_lengths)
        drafted += s.steps - s.undrafted_steps
        draft_s += s.draft_time_s
    result = {"tau": accepted / max(steps, 1), "prompts": len(prompts)}
    if drafted:  # drafting time per drafting step, in 1-token steps of the measured cost curve
        result["draft_greedy_steps"] = draft_s / drafted / gen.cost_curve()(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result) + "\n")
    return result
