"""The benchmark pipeline behind ``draftheads bench`` and ``draftheads demo``, on the embedded target.

Stages, each cached under ``bench.out_dir`` so that a rerun skips what is done, each in a module
of its own (:mod:`~draftheads.bench.data_stages` 1–2, :mod:`~draftheads.bench.train_stages` 3–4,
:mod:`~draftheads.bench.eval_stage` 5; the teacher-forced stages in
:mod:`~draftheads.bench.teacher_stages`); this module runs them in order:

1. **distill**: the target answers prompts greedily (the embedded train split, plus GSM8K
   train and CodeAlpaca when the optional ``bench.shared_data`` folder exists) and, optionally, prompts it wrote
   itself; ``data.distill`` is resumable row by row.
2. **features**: one offline feature cache of the distilled chats holding every layer any
   drafter reads (the union of their training layers).
3. **train**: each drafter in ``bench.drafters`` on the cached features (the streamed drafters,
   ``BenchDrafter.streamed``, on the same data and passes, each reading the cache's layers it
   trains on).
4. **tree**: a drafter whose tree stage picks a static tree (``BenchDrafter.tree``) gets the one
   chosen from its measured head accuracies (``draftheads tree``).
5. **eval**: every drafter on every prompt set (held-out, Spec-Bench, GSM8K test) against
   plain greedy ``generate`` and prompt lookup decoding, all in one loop per set: the greedy
   runs are decoded once per turn for every drafter, and every ratio comes from one run. With
   ``bench.drafter_only`` every drafter's held-out τ is measured once more with its own tree
   alone (no lookup branch, no cost-aware planning): the drafter's own progress
   (:mod:`~draftheads.bench.drafter_only`). With ``bench.workloads`` the lead drafter is also
   measured beyond batch 1, on the long and copy sets and on its first call
   (:mod:`~draftheads.bench.workload_stage`).
6. **study** (a maintainer's, from a checkout: ``python -m bench.lab.study``): τ on held-out
   prompts against training tokens for the lead drafter, the ablation rows at equal data, and
   ``bench.variants``: rows trained on the main data and passes, each measured drafter only. The
   installed bench refuses them (:mod:`~draftheads.bench.extension`).

The results, with the commands, the hardware and each stage's minutes
(:mod:`~draftheads.bench.stage_times`), are written to ``bench.docs``.
``draftheads demo`` runs the same stages at a size that fits in minutes, then streams one answer.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftheads.bench.data_stages import stage_distill, stage_features
from draftheads.bench.drafter_only import main_data, stage_alone
from draftheads.bench.eval_stage import stage_eval
from draftheads.bench.extension import NO_ROWS, MainRun, Rows
from draftheads.bench.figures import check_docs
from draftheads.bench.report import scaling_plot, summary_lines, write_docs
from draftheads.bench.stage_times import stage_minutes
from draftheads.bench.stages import drafter_rows, log
from draftheads.bench.teacher_stages import cache_layers, stage_teacher, train_on
from draftheads.bench.train_stages import stage_train, stage_tree
from draftheads.bench.workload_stage import stage_workloads
from draftheads.conf.commands.args import BenchArgs, DemoArgs
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.bench_drafters import bench_drafter, lead_drafter, row_base
from draftheads.data.outdir import guard_out_dir

# the published dynamic tree of Li et al. (2024) (top-10 expansions, depth 6, 60 nodes, every one
# verified): the tree their τ figures are measured with; ``bench.published_tree`` adds the lead
# drafter under it, in a row of its own
PUBLISHED_TREE = {"dynamic": True, "top_k_draft": 10, "depth": 6, "total_tokens": 60, "cost_aware": False}
TREE_ROW = "{name} (published 60-node tree)"


def pipeline(cfg: BenchArgs | DemoArgs, b: BenchConfig, study: Rows = NO_ROWS) -> dict[str, Any]:
    """Run (or resume) every stage, then the rows of a maintainer's ``study`` (none when
    installed); returns what the docs page is written from. A row the study refuses or an output
    folder the guard refuses stops it before the first stage."""
    from draftheads.heads.target.fingerprint import fingerprint
    from draftheads.heads.target.load import load_target

    study.check(b)
    guard_out_dir(b.out_dir, "bench", "bench.out_dir")
    t0 = time.perf_counter()
    target, tok = load_target(cfg.target)
    H, L = target.config.hidden_size, fingerprint(target).num_layers
    read = cache_layers(list(b.drafters), L, study.overrides(b))  # every layer a cache holds
    data_dirs = stage_distill(cfg, b, target, tok) if b.distill_prompts else []
    distilled = None  # with teacher-forced data: the distilled answers' own cache, mixed in by view
    if b.teacher_tokens:
        cache = stage_teacher(cfg, b, target, tok, read)
        if data_dirs:
            distilled = stage_features(cfg, b, target, tok, data_dirs, read)
    else:
        cache = stage_features(cfg, b, target, tok, data_dirs, read)
    results: dict[str, Any] = {"drafters": {}, "scaling": [], "train": {}, "ablations": {}}
    if b.teacher_tokens:
        results["data"] = json.loads((cache / ".done").read_text())
    drafters = [bench_drafter(name) for name in b.drafters]
    streamed = bool(b.teacher_tokens) and (bool(b.variants) or any(d.streamed for d in drafters))
    data = main_data(b, cache, distilled) if streamed else None  # equal compute to the scaling points
    if data and data.note:
        results["mixture"] = {**json.loads((distilled / ".done").read_text()), **data.note}
    for d in drafters:
        heads = Path(b.out_dir) / d.name
        if data and d.streamed:  # streamed from the cache (or the view with the distilled answers)
            source, tokens, epochs, note = data
            train_on(cfg, b, target, source, heads, tokens, epochs, d.row(), note=note)
        else:
            limit = getattr(b, d.tokens) if b.teacher_tokens and d.tokens else None
            rows = drafter_rows(d, cache, H, L, limit)
            stage_train(cfg, b, d.name, rows, getattr(b, d.steps), heads)
            del rows
        results["train"][d.name] = json.loads((heads / ".done").read_text())
        if d.tree:
            stage_tree(cfg, target, tok, heads)
    # every drafter in one loop per prompt set: the greedy baselines are decoded once for all
    trained = {name: Path(b.out_dir) / name for name in b.drafters}
    results["drafters"] = {name: {} for name in b.drafters}
    for name in b.eval_sets:
        for drafter, rep in stage_eval(cfg, b, target, tok, trained, name).items():
            results["drafters"][drafter][name] = rep
    lead = lead_drafter(list(b.drafters))
    if b.published_tree and lead:
        row = results["drafters"][TREE_ROW.format(name=lead)] = {}
        for name in b.eval_sets:
            reports = stage_eval(cfg, b, target, tok, {lead: trained[lead]}, name, PUBLISHED_TREE)
            if lead in reports:  # absent when the prompt set is
                row[name] = reports[lead]
    if b.workloads and lead:
        results["workloads"] = stage_workloads(cfg, b, target, tok, trained[lead])
    if b.drafter_only and "heldout" in b.eval_sets:
        results["drafter_only"] = {
            name: stage_alone(cfg, b, target, tok, trained[name]) for name in b.drafters
        }
    results.update(study.run(MainRun(cfg, b, target, tok, cache, distilled, data, lead, results)))
    results["stage_minutes"] = stage_minutes(b)
    results["seconds"] = time.perf_counter() - t0
    return results


def bench(cfg: BenchArgs, study: Rows = NO_ROWS) -> None:
    """``make bench``: the whole pipeline at benchmark size, with the rows of a maintainer's
    ``study`` when one hands them; writes ``bench.docs`` (checked first)."""
    b = cfg.bench
    if b.docs:
        check_docs(Path(b.docs))
    results = pipeline(cfg, b, study)
    results["command"] = study.command()
    out = Path(b.out_dir)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    if results["scaling"]:
        scaling_plot(results["scaling"], out / "scaling.png")
    if b.docs:
        write_docs(results, b, Path(b.docs))
        log(f"results written to {b.docs}")
    print(summary_lines(results))


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
        drafters=[row_base().name],
        eagle_steps=90,
        scaling_tokens=[],
        eval_sets=["heldout"],
        eval_prompts=6,
        eval_new_tokens=96,
        baselines=[],
        drafter_only=False,
        workloads=False,
        shared_data="",  # the embedded default only
        docs="",
    )
    results = pipeline(cfg, b)
    print(summary_lines(results))
    prompt = cfg.prompt or "Write a Python function that checks whether a number is prime."
    log(f"streaming one answer with speculative decoding: {prompt!r}")
    decode = replace(cfg.decode, max_new_tokens=160)
    generate(GenerateArgs(cfg.target, decode, heads=str(Path(b.out_dir) / b.drafters[0]), prompt=prompt))
