"""The benchmark's figures file, ``benchmarks.json`` beside its docs page: every figure of the
page's tables, the command and settings that measured them, and what other commands recorded there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftheads.bench.workload_stage import workload_figures
from draftheads.conf.commands.checks import writable_file
from draftheads.conf.errors import UserError
from draftheads.data.outdir import read_json


def figures(results: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the tables: the environment, training, acceptance and speed per drafter and
    prompt set (prompt lookup's beside it), Spec-Bench per category, the scaling points, the
    ablation rows and the variants."""
    keys = (
        "tau",
        "speedup",
        "speedup_vs_stock",
        "backend",
        "tokens_per_s",
        "stock_tokens_per_s",
        "baseline_tokens_per_s",
        "step_cost_greedy_steps",
        "draft_cost_greedy_steps",
        "greedy_identical",
        "num_turns",
    )
    drafters = {
        kind: {
            name: {
                **{k: r.get(k) for k in keys},
                "pld": {k: r["pld"].get(k) for k in ("tau", "speedup", "tokens_per_s")}
                if "pld" in r
                else None,
                "per_category": {
                    c: {
                        **{k: v.get(k) for k in ("tau", "speedup")},
                        **({"pld": {k: v["pld"].get(k) for k in ("tau", "speedup")}} if "pld" in v else {}),
                    }
                    for c, v in (r.get("per_category") or {}).items()
                },
            }
            for name, r in reports.items()
        }
        for kind, reports in results["drafters"].items()
    }
    env = next(
        (
            r["environment"]
            for reps in results["drafters"].values()
            for r in reps.values()
            if "environment" in r
        ),
        None,
    )
    # the hardware and versions (not the decode settings, which may name this machine's paths)
    hardware = ("device", "gpu", "cpu", "cpu_count", "torch_threads", "dtype", "versions")
    return {
        "environment": {k: env.get(k) for k in hardware} if env else None,
        "train": results["train"],
        "data": results.get("data"),
        "mixture": results.get("mixture"),
        "drafters": drafters,
        "drafter_only": results.get("drafter_only", {}),
        "scaling": results.get("scaling", []),
        "ablations": results.get("ablations", {}),
        "variants": results.get("variants", {}),
        "stage_minutes": results.get("stage_minutes", {}),
        "seconds": results.get("seconds"),
        **workload_figures(results.get("workloads")),
    }


def check_docs(path: Path) -> None:
    """Refuse, before the pipeline runs, a ``bench.docs`` page that cannot be written, and a
    figures file beside it (``.json``) that the bench did not write (it would be replaced)."""
    if path.suffix == ".json":
        raise UserError(
            f"bench.docs={path} is a JSON file; give a Markdown page, e.g. bench.docs=docs/benchmarks.md"
        )
    writable_file(path, "bench.docs")
    figures_file = path.with_suffix(".json")
    if figures_file.exists():
        record = read_json(figures_file)
        if record is None or not {"command", "settings"} <= set(record):
            raise UserError(
                f"bench.docs={path}: {figures_file} beside it was not written by draftheads bench and would be "
                "replaced by the figures; move it or choose another page (e.g. bench.docs=docs/benchmarks.md)"
            )


# keys of docs/benchmarks.json that other commands write, kept when the bench rewrites it
KEPT_KEYS = ("workloads", "first_call", "reduced_runs", "full_runs")


def write_figures(results: dict[str, Any], settings: dict[str, Any], path: Path) -> None:
    """``docs/benchmarks.json``: the figures of ``docs/benchmarks.md``, the command and settings,
    and what other runs recorded there (:data:`KEPT_KEYS`, e.g. ``full_runs`` from other machines)."""
    record = {"command": results.get("command", "draftheads bench"), "settings": settings, **figures(results)}
    earlier = read_json(path) if path.exists() else None
    for key in KEPT_KEYS:  # unless this run measured them itself
        if isinstance(earlier, dict) and key in earlier and key not in record:
            record[key] = earlier[key]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
