"""Stage 5 of the bench: every drafter on one prompt set against the greedy baselines, in one loop.

Plain greedy ``generate`` and prompt lookup decoding are decoded once per turn for every
drafter, so every ratio on the page comes from one run; each drafter's report is cached in its
own folder, and a rerun decodes only the drafters whose report is missing.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftheads.bench.stages import done, eval_prompts, log, mark_done
from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.commands.checks import drafter_digest
from draftheads.conf.schema import BenchConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def stage_eval(
    cfg: BenchArgs,
    b: BenchConfig,
    target: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    heads: dict[str, Path],
    name: str,
    tree: dict[str, Any] | None = None,
) -> dict[str, dict]:
    """Every drafter of ``heads`` (kind -> folder) on one prompt set, in one loop: stock and
    same-backend greedy run once per turn for all of them, the baselines once (reported with
    the first drafter). Each drafter's report is cached in its own ``eval-<set>`` folder; a
    rerun decodes only the drafters whose report is missing. ``tree``: decode settings that
    replace the configured tree (the pipeline's ``PUBLISHED_TREE``), reported in
    ``eval-<set>-tree`` folders without the baselines."""
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
