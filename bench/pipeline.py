"""The benchmark pipeline behind ``draftheads bench`` and ``draftheads demo``, on the embedded target.

Stages, each cached under ``bench.out_dir`` so that a rerun skips what is done:

1. **distill**: the target answers prompts greedily (the embedded train split, plus GSM8K
   train and CodeAlpaca when the optional ``bench.shared_data`` folder exists) and, optionally, prompts it wrote
   itself; ``data.distill`` is resumable row by row.
2. **features**: one offline feature cache of the distilled chats holding every layer any
   drafter reads (EAGLE-3's three plus the final state; Medusa reads the final state).
3. **train**: each drafter in ``bench.drafters`` on the cached features (DFlash on the same
   data and passes as EAGLE-3, reading three of the cache's layers).
4. **tree**: the Medusa tree is chosen from measured head accuracies (``draftheads tree``).
5. **eval**: every drafter on every prompt set (held-out, Spec-Bench, GSM8K test) against
   plain greedy ``generate`` and prompt lookup decoding, all in one loop per set: the greedy
   runs are decoded once per turn for every drafter, and every ratio comes from one run.
6. **scaling**: τ on held-out prompts against training tokens for the EAGLE drafter.

The results, with the commands and the hardware, are written to ``bench.docs``.
``draftheads demo`` runs the same stages at a size that fits in minutes, then streams one answer.
"""

from __future__ import annotations

import json
import math
import random
import shlex
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from draftheads.bench import study
from draftheads.bench.report import check_docs, scaling_plot, summary_lines, write_docs
from draftheads.bench.stages import (
    answer_tokens,
    compose,
    done,
    eval_prompts,
    load_rows,
    log,
    mark_done,
    target_group,
    train_overrides,
)
from draftheads.conf.commands.args import BenchArgs, DemoArgs
from draftheads.conf.commands.checks import drafter_digest
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.heads import DraftConfig
from draftheads.data.outdir import guard_out_dir

EAGLE_KINDS = {"eagle": "eagle", "eagle3": "eagle3"}
# drafters trained from the teacher-forced cache on disk (same data and passes), and the
# overrides that pick them on the bench's EAGLE-3 recipe
STREAMED: dict[str, list[str]] = {"eagle3": [], "dflash": ["draft=dflash"]}
# EAGLE-2's published tree (top-10 expansions, depth 6, 60 nodes, every one verified): the tree
# EAGLE's τ figures are measured with; ``bench.published_tree`` adds the EAGLE drafter under it
PUBLISHED_TREE = {"dynamic": True, "top_k_draft": 10, "depth": 6, "total_tokens": 60, "cost_aware": False}
TREE_ROW = "{kind} (EAGLE-2 tree)"


# ---- 1. distill -------------------------------------------------------------------------
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


def stage_distill(cfg: BenchArgs, b: BenchConfig, target, tok) -> list[Path]:
    from draftheads.data.distill import distill
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


# ---- 2. features ------------------------------------------------------------------------
def stage_features(cfg: BenchArgs, b: BenchConfig, target, tok, data_dirs: list[Path]) -> Path:
    import datasets

    from draftheads.data.cache_build import build_feature_cache
    from draftheads.data.prepare import prepare_dataset
    from draftheads.heads.target_fingerprint import fingerprint

    out = Path(b.out_dir) / "features"
    # beside a teacher-forced cache, the same label columns (top-k), so the two train as one
    topk = b.topk if b.teacher_tokens else 0
    # every layer the drafters and ablation rows read (EAGLE-3's: a superset of Medusa's final
    # state), so one cache serves them all
    layers = study.row_layers(list(b.ablations), list(b.drafters), fingerprint(target).num_layers)
    made = {"data": [d.name for d in data_dirs], "topk": topk, "layers": layers}
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
    study.write_answer_tokens(out, [sum(m) for m in ds["loss_mask"]])
    answer = sum(map(sum, ds["loss_mask"]))
    mark_done(out, {"rows": len(ds), "answer_tokens": answer, "seconds": time.perf_counter() - t0}, made)
    return out


# ---- 3. train ---------------------------------------------------------------------------
def stage_train(cfg: BenchArgs, b: BenchConfig, kind: str, rows: list[dict], steps: int, out: Path) -> Path:
    from draftheads.train.recipe import train

    made = {"kind": kind, "steps": steps, "answer_tokens": answer_tokens(rows)}
    if done(out, made):
        return out
    log(f"train {kind}: {len(rows)} rows, {made['answer_tokens']} answer tokens, {steps} steps")
    t0 = time.perf_counter()
    tcfg = compose([f"target={target_group(cfg)}", *train_overrides(kind, out, steps)])
    tcfg.target = cfg.target
    train(tcfg, rows=rows)
    mark_done(
        out,
        {"seconds": time.perf_counter() - t0, "answer_tokens": made["answer_tokens"], "steps": steps},
        made,
    )
    return out


# ---- 4. tree ----------------------------------------------------------------------------
def stage_tree(cfg: BenchArgs, target, tok, heads: Path) -> None:
    """Choose the Medusa tree from measured head accuracies and this device's costs (tree.json)."""
    from draftheads.data.prompts import load_prompts
    from draftheads.decode.tree import TREE_FILE
    from draftheads.decode.tree_select import select_tree
    from draftheads.heads import Drafter

    if (heads / TREE_FILE).is_file():
        return
    log("tree: measuring Medusa head accuracies and the verification cost curve")
    dc = replace(cfg.decode, tree_size=0, tree_max_size=16)
    prompts = [r.turns[0] for r in load_prompts("heldout", max_prompts=dc.tree_prompts, tokenizer=tok)]
    drafter = Drafter.from_pretrained(heads, target=target, tokenizer=tok, map_location=target.device)
    t0 = time.perf_counter()
    record = select_tree(target, drafter, tok, prompts, dc, log=log)
    record["seconds"] = time.perf_counter() - t0
    (heads / TREE_FILE).write_text(json.dumps(record, indent=1) + "\n")


# ---- 5. eval ----------------------------------------------------------------------------
def stage_eval(
    cfg: BenchArgs,
    b: BenchConfig,
    target,
    tok,
    heads: dict[str, Path],
    name: str,
    tree: dict[str, Any] | None = None,
) -> dict[str, dict]:
    """Every drafter of ``heads`` (kind -> folder) on one prompt set, in one loop: stock and
    same-backend greedy run once per turn for all of them, the baselines once (reported with
    the first drafter). Each drafter's report is cached in its own ``eval-<set>`` folder; a
    rerun decodes only the drafters whose report is missing. ``tree``: decode settings that
    replace the configured tree (:data:`PUBLISHED_TREE`), reported in ``eval-<set>-tree``
    folders without the baselines."""
    from draftheads.decode.evaluate import run_eval
    from draftheads.decode.report import environment, summarize, write_report
    from draftheads.heads import Drafter

    first = next(iter(heads))
    folder = f"eval-{name}" + ("-tree" if tree else "")

    def made(kind: str) -> dict[str, Any]:
        return {
            "prompts": b.eval_prompts,
            "new_tokens": b.eval_new_tokens,
            "per_category": b.spec_bench_per_category,
            "baselines": list(b.baselines) if kind == first and not tree else [],
            **({"tree": tree} if tree else {}),
        }

    reports = {
        k: json.loads((p / folder / "report.json").read_text())
        for k, p in heads.items()
        if done(p / folder, made(k))
    }
    todo = [k for k in heads if k not in reports]
    if not todo:
        return reports
    prompts = eval_prompts(name, b, tok)
    if not prompts:
        log(f"eval on {name}: skipped (no prompts; is {b.shared_data} there?)")
        return reports
    how = f" with {json.dumps(tree)}" if tree else ""
    log(f"eval {', '.join(todo)} on {name}{how}: {len(prompts)} prompts, {b.eval_new_tokens} new tokens")
    baselines = made(first)["baselines"] if first in todo else []
    decode = replace(cfg.decode, max_new_tokens=b.eval_new_tokens, **(tree or {}))
    drafters = {k: Drafter.from_pretrained(heads[k], target=target, tokenizer=tok) for k in todo}
    t0 = time.perf_counter()
    runs = run_eval(target, tok, drafters, prompts, decode, baselines, warmup=cfg.eval.warmup)
    seconds = time.perf_counter() - t0
    env = environment(target, decode)
    for k in todo:
        kept = made(k)["baselines"]  # the baselines' figures are reported with the first drafter
        report = summarize(runs[k], kept)
        report.update(
            prompts=name,
            heads=str(heads[k]),
            drafter=drafters[k].kind,
            drafter_sha256=drafter_digest(heads[k]),
            environment=env,
        )
        out = heads[k] / folder
        write_report(report, runs[k], kept, out)
        mark_done(out, {"seconds": seconds, "decoded_with": todo}, made(k))
        reports[k] = report
    return {k: reports[k] for k in heads if k in reports}


# ---- 6. scaling -------------------------------------------------------------------------
def stage_scaling(cfg: BenchArgs, b: BenchConfig, target, tok, cache: Path, kind: str) -> list[dict]:
    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.prompting import encode_prompt
    from draftheads.heads import Drafter

    H = target.config.hidden_size
    prompts = eval_prompts("heldout", b, tok)
    points = []
    for n in b.scaling_tokens:
        out = Path(b.out_dir) / "scaling" / f"{kind}-{n}"
        result = out / "tau.json"
        if not result.is_file():
            rows = load_rows(cache, H, "all" if kind != "medusa" else "last", max_tokens=n)
            have = answer_tokens(rows)
            if have < 0.9 * n:
                log(f"scaling: only {have} answer tokens cached, fewer than {n}; skipping this point")
                continue
            steps = max(50, math.ceil(have / 10_000 * b.scaling_steps_per_10k_tokens))
            stage_train(cfg, b, kind, rows, steps, out / "drafter")
            del rows
            drafter = Drafter.from_pretrained(out / "drafter", target=target, tokenizer=tok)
            gen = SpeculativeGenerator(target, drafter, tokenizer=tok, config=cfg.decode)
            accepted, steps_n = 0, 0
            for p in prompts:
                ids = encode_prompt(tok, p.turns[0]).to(next(target.parameters()).device)
                gen.generate(ids, max_new_tokens=b.eval_new_tokens)
                accepted += sum(gen.last_stats.accepted_lengths)
                steps_n += len(gen.last_stats.accepted_lengths)
            result.write_text(
                json.dumps(
                    {
                        "answer_tokens": have,
                        "steps": steps,
                        "tau": accepted / max(steps_n, 1),
                        "prompts": len(prompts),
                    }
                )
                + "\n"
            )
        points.append(json.loads(result.read_text()))
        log(f"scaling {kind}: {points[-1]['answer_tokens']} tokens -> tau {points[-1]['tau']:.2f}")
    return points


def main_point(results: dict[str, Any], kind: str) -> list[dict]:
    """The main drafter as the curve's last point: it was trained on every cached token and
    evaluated on the same held-out prompts and length as the scaling points."""
    report = results["drafters"].get(kind, {}).get("heldout")
    if report is None:
        return []
    train = results["train"][kind]
    return [
        {
            "answer_tokens": train["answer_tokens"],
            "steps": train.get("steps"),
            "epochs": train.get("epochs"),
            "seconds": train.get("seconds"),
            "tau": report["tau"],
            "prompts": report["num_prompts"],
        }
    ]


# ---- stage times -------------------------------------------------------------------------
def stage_minutes(b: BenchConfig) -> dict[str, float | None]:
    """Minutes each stage of the main run took, read from the records the stages wrote (None:
    a record made before stages were timed). Opt-in scaling points, ablation rows and the
    published-tree evaluations are left out: the first two report their own training minutes,
    the last its tokens/s. An evaluation counts each of its decoding runs once, however many
    drafters shared it."""
    out = Path(b.out_dir)

    def minutes(record: Path) -> float | None:
        seconds = json.loads(record.read_text()).get("seconds")
        return None if seconds is None else seconds / 60

    records = [
        ("distill", out / "distill" / "prompts" / ".done"),
        ("distill, target-written prompts", out / "distill" / "self" / ".done"),
        ("teacher-forced features", out / "teacher" / ".done"),
        ("distilled answers' features" if b.teacher_tokens else "features", out / "features" / ".done"),
    ]
    for kind in b.drafters:
        records.append((f"train {kind}", out / kind / ".done"))
        if kind == "medusa":
            records.append(("medusa tree", out / kind / "tree.json"))
    times = {name: minutes(path) for name, path in records if path.is_file()}
    for name in b.eval_sets:
        runs = set()
        for kind in b.drafters:
            marker = out / kind / f"eval-{name}" / ".done"
            if marker.is_file():
                record = json.loads(marker.read_text())
                runs.add((tuple(record.get("decoded_with", [kind])), record.get("seconds")))
        if runs:
            seconds = [s for _, s in runs]
            times[f"eval {name}"] = None if None in seconds else sum(seconds) / 60
    return times


# ---- the pipeline -----------------------------------------------------------------------
def pipeline(cfg: BenchArgs | DemoArgs, b: BenchConfig) -> dict[str, Any]:
    """Run (or resume) every stage; returns what the docs page is written from. An unknown
    ablation row or an output folder the guard refuses stops it before the first stage."""
    from draftheads.heads.target import load_target
    from draftheads.heads.target_fingerprint import fingerprint

    study.check_ablations(b)
    guard_out_dir(b.out_dir, "bench", "bench.out_dir")
    t0 = time.perf_counter()
    target, tok = load_target(cfg.target)
    H, L = target.config.hidden_size, fingerprint(target).num_layers
    data_dirs = stage_distill(cfg, b, target, tok) if b.distill_prompts else []
    distilled = None  # with teacher-forced data: the distilled answers' own cache, mixed in by view
    if b.teacher_tokens:
        cache = study.stage_teacher(cfg, b, target, tok)
        if data_dirs:
            distilled = stage_features(cfg, b, target, tok, data_dirs)
    else:
        cache = stage_features(cfg, b, target, tok, data_dirs)
    results: dict[str, Any] = {"drafters": {}, "scaling": [], "train": {}, "ablations": {}}
    if b.teacher_tokens:
        results["data"] = json.loads((cache / ".done").read_text())
    for kind in b.drafters:
        heads = Path(b.out_dir) / kind
        if b.teacher_tokens and kind in STREAMED:  # streamed from the cache, equal compute to scaling
            tokens = json.loads((cache / ".done").read_text())["answer_tokens"]
            source, note = cache, {}
            epochs = b.scaling_compute / max(tokens, 1)  # passes over the teacher tokens
            if distilled is not None:  # the same passes over a view that adds the distilled ones
                source, note = study.mixture(b, cache, distilled)
                results["mixture"] = {**json.loads((distilled / ".done").read_text()), **note}
                tokens += note["distilled_tokens"]
            study.train_on(cfg, b, target, source, heads, tokens, epochs, STREAMED[kind], note=note)
        else:
            limit = b.medusa_tokens if b.teacher_tokens and kind == "medusa" else None
            layers = DraftConfig(kind="dflash").training_layers(L) if kind == "dflash" else None
            rows = load_rows(cache, H, "last" if kind == "medusa" else "all", limit, layers)
            stage_train(cfg, b, kind, rows, b.medusa_steps if kind == "medusa" else b.eagle_steps, heads)
            del rows
        results["train"][kind] = json.loads((heads / ".done").read_text())
        if kind == "medusa":
            stage_tree(cfg, target, tok, heads)
    # every drafter in one loop per prompt set: the greedy baselines are decoded once for all
    trained = {kind: Path(b.out_dir) / kind for kind in b.drafters}
    results["drafters"] = {kind: {} for kind in b.drafters}
    for name in b.eval_sets:
        for kind, rep in stage_eval(cfg, b, target, tok, trained, name).items():
            results["drafters"][kind][name] = rep
    eagle = next((k for k in b.drafters if k in EAGLE_KINDS), None)
    if b.published_tree and eagle:
        row = results["drafters"][TREE_ROW.format(kind=eagle)] = {}
        for name in b.eval_sets:
            reports = stage_eval(cfg, b, target, tok, {eagle: trained[eagle]}, name, PUBLISHED_TREE)
            if eagle in reports:  # absent when the prompt set is
                row[name] = reports[eagle]
    if b.teacher_tokens:
        points = study.stage_scaling(cfg, b, target, tok, cache)
        # the main drafter is a point of the equal-compute curve unless distilled data was added
        main = eagle == "eagle3" and distilled is None
        results["scaling"] = points + (main_point(results, eagle) if main else [])
        results["ablations"] = study.stage_ablations(cfg, b, target, tok, cache, distilled)
    elif eagle and b.scaling_tokens:
        results["scaling"] = stage_scaling(cfg, b, target, tok, cache, eagle) + main_point(results, eagle)
    results["stage_minutes"] = stage_minutes(b)
    results["seconds"] = time.perf_counter() - t0
    return results


def bench(cfg: BenchArgs) -> None:
    """``make bench``: the whole pipeline at benchmark size; writes ``bench.docs`` (checked first)."""
    b = cfg.bench
    if b.docs:
        check_docs(Path(b.docs))
    results = pipeline(cfg, b)
    results["command"] = command_line()
    out = Path(b.out_dir)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    if results["scaling"]:
        scaling_plot(results["scaling"], out / "scaling.png")
    if b.docs:
        write_docs(results, b, Path(b.docs))
        log(f"results written to {b.docs}")
    print(summary_lines(results))


def command_line() -> str:
    """The command that ran the bench: ``draftheads bench`` with its overrides."""
    args = sys.argv[1:]
    return shlex.join(["draftheads", *args]) if args[:1] == ["bench"] else "draftheads bench"


def demo(cfg: DemoArgs) -> None:
    """``make demo``: a small drafter trained, evaluated and streaming, in minutes (fixed sizes)."""
    from draftheads.conf.commands.args import GenerateArgs
    from draftheads.conf.commands.decode import generate

    b = replace(
        BenchConfig(),
        out_dir="outputs/demo",
        distill_prompts=128,
        self_prompts=0,
        teacher_tokens=0,
        distill_new_tokens=128,
        drafters=["eagle3"],
        eagle_steps=90,
        scaling_tokens=[],
        eval_sets=["heldout"],
        eval_prompts=6,
        eval_new_tokens=96,
        baselines=[],
        shared_data="",  # the embedded default only
        docs="",
    )
    results = pipeline(cfg, b)
    print(summary_lines(results))
    prompt = cfg.prompt or "Write a Python function that checks whether a number is prime."
    log(f"streaming one answer with speculative decoding: {prompt!r}")
    decode = replace(cfg.decode, max_new_tokens=160)
    generate(GenerateArgs(cfg.target, decode, heads=str(Path(b.out_dir) / "eagle3"), prompt=prompt))
