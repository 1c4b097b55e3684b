"""The evaluation report: the turns' numbers (overall and per category), as JSON and Markdown."""

from __future__ import annotations

import json
import os
import platform
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.backend_choice import as_record, choose_target
from draftheads.decode.cost import device_name
from draftheads.decode.evaluate import TurnResult


def summarize(results: list[TurnResult], baselines: list[str]) -> dict[str, Any]:
    """Aggregate turns into the report's numbers (overall and per category)."""

    def agg(rs: list[TurnResult]) -> dict[str, Any]:
        steps = [a for r in rs for a in r.accepted_lengths]
        new = sum(r.new_tokens for r in rs)
        spec_s, generate_s = sum(r.spec_time_s for r in rs), sum(r.base_time_s for r in rs)
        stock_s = sum(r.stock_time_s for r in rs)
        # the baseline: the faster plain loop on the backend (generate, or the retiring loop where
        # it ran on every turn); greedy, so both emit the decoder's tokens
        ran = rs and all(r.retiring_time_s is not None for r in rs)
        retiring_s = sum(r.retiring_time_s for r in rs) if ran else None
        baseline = "retiring" if retiring_s is not None and 0 < retiring_s < generate_s else "generate"
        base_s = retiring_s if baseline == "retiring" else generate_s
        draft_s, verify_s = sum(r.draft_time_s for r in rs), sum(r.verify_time_s for r in rs)
        nodes = [t for r in rs for t in r.tree_tokens]
        depth = max(steps, default=1)
        # per_position_acceptance[i]: fraction of decoding steps that accepted more than i+1
        # tokens, i.e. whose (i+1)-th drafted token was accepted.
        ppa = [sum(a > i + 1 for a in steps) / max(len(steps), 1) for i in range(depth - 1)]
        out = {
            "tau": sum(steps) / max(len(steps), 1),
            "per_position_acceptance": ppa,
            "tokens_per_s": new / spec_s if spec_s else 0.0,
            "baseline_tokens_per_s": new / base_s if base_s else 0.0,
            "speedup": base_s / spec_s if spec_s else 0.0,
            "baseline": baseline,  # which plain loop the speedup is against
            "generate_tokens_per_s": new / generate_s if generate_s else 0.0,
            "retiring_tokens_per_s": new / retiring_s if retiring_s else None,
            # against what a user has without draftheads: transformers' greedy generate, eager
            "stock_tokens_per_s": new / stock_s if stock_s else 0.0,
            "speedup_vs_stock": stock_s / spec_s if spec_s else 0.0,
            "backend": rs[0].backend if rs else "eager",
            # identical to greedy on the same backend (the guarantee), and also to stock generate
            "greedy_identical": sum(r.identical for r in rs) / max(len(rs), 1),
            "identical_to_stock": sum(r.identical_stock for r in rs) / max(len(rs), 1),
            "tree_tokens_per_step": sum(nodes) / max(len(nodes), 1),
            "num_turns": len(rs),
            "num_prompts": len({r.prompt_id for r in rs}),
            "num_new_tokens": new,
            "target_forwards": sum(r.target_forwards for r in rs),
            "accepted_length_histogram": {str(k): steps.count(k) for k in sorted(set(steps))},
            # where a decoding step's time goes: the drafter's proposal, and the target's verify
            # forward; against the baseline's ms per token they give the break-even τ
            "draft_ms_per_step": 1e3 * draft_s / max(len(steps), 1),
            "verify_ms_per_step": 1e3 * verify_s / max(len(steps), 1),
            "baseline_ms_per_token": 1e3 * base_s / new if new else 0.0,
        }
        # a step's cost in greedy steps (same backend): break-even τ; draft share alone too
        greedy_s = base_s / new if new else 0.0
        per_step = (draft_s + verify_s) / max(len(steps), 1)
        out["step_cost_greedy_steps"] = per_step / greedy_s if greedy_s else 0.0
        out["draft_cost_greedy_steps"] = draft_s / max(len(steps), 1) / greedy_s if greedy_s else 0.0
        # the speculative wall time in parts that add up to it (decode/stats.py), in seconds
        parts = dict.fromkeys((k for r in rs for k in r.time_split), 0.0)
        for r in rs:
            for k, v in r.time_split.items():
                parts[k] += v
        out["time_split_s"] = parts
        for b in baselines:
            b_new = sum(r.baselines[b]["new_tokens"] for r in rs)
            b_s = sum(r.baselines[b]["time_s"] for r in rs)
            b_fw = sum(r.baselines[b]["target_forwards"] for r in rs)
            # the first forward of a generate call is the prefill, not a decoding step, and its
            # token is not a decoding step's either (as for τ above)
            b_steps = b_fw - len(rs)
            out[b] = {
                "tau": (b_new - len(rs)) / max(b_steps, 1),
                "tokens_per_s": b_new / b_s if b_s else 0.0,
                # transformers' own baselines run on stock generate: compare them with it
                "speedup": stock_s / b_s if b_s else 0.0,
            }
        return out

    report = agg(results)
    cats = defaultdict(list)
    for r in results:
        cats[r.category].append(r)
    if len(cats) > 1:
        report["per_category"] = {c: agg(rs) for c, rs in sorted(cats.items())}
    return report


def environment(target: nn.Module, decode: DecodeConfig) -> dict[str, Any]:
    """Hardware, library versions and decode settings, recorded with every report."""
    import transformers

    from draftheads.conf import __version__

    device = next(target.parameters()).device
    cpu = device_name(torch.device("cpu"))
    return {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(next(target.parameters()).dtype).replace("torch.", ""),
        "versions": {
            "draftheads": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "decode": dict(vars(decode)),
        # the target's backend and every candidate's measured step (cached by the generator)
        "backend_choice": as_record(choose_target(decode.backend, target, decode.cost_cache)),
    }


def write_markdown(report: dict[str, Any], baselines: list[str], path: Path) -> None:
    """A Markdown table: overall row, then one row per category."""
    cols = ["τ", "tok/s", "plain tok/s", "speedup", "generate tok/s", "retiring tok/s"]
    cols += ["stock tok/s", "speedup vs stock"]
    cols += ["greedy identical", "identical to stock", "turns", "new tokens", "nodes/step"]
    cols += ["draft ms/step", "verify ms/step", "greedy ms/token", "step cost (greedy steps)"]
    cols += [f"{b} τ" for b in baselines] + [f"{b} speedup" for b in baselines]
    lines = [
        f"Backend: {report.get('backend', 'eager')}. Plain = the faster greedy plain loop on that backend "
        f"({report.get('baseline', 'generate')} here): the target's `generate` or the retiring batched loop; "
        "the speedup is against it. Stock = transformers' greedy `generate` (eager); baselines are "
        "compared with stock.",
        "",
        "| set | " + " | ".join(cols) + " |",
        "|" + "---|" * (len(cols) + 1),
    ]

    def row(name: str, r: dict[str, Any]) -> str:
        vals = [
            f"{r['tau']:.2f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['baseline_tokens_per_s']:.1f}",
            f"{r['speedup']:.2f}×",
            f"{r.get('generate_tokens_per_s', r['baseline_tokens_per_s']):.1f}",
            f"{r['retiring_tokens_per_s']:.1f}" if r.get("retiring_tokens_per_s") else "-",
            f"{r['stock_tokens_per_s']:.1f}",
            f"{r['speedup_vs_stock']:.2f}×",
            f"{r['greedy_identical']:.2f}",
            f"{r['identical_to_stock']:.2f}",
            str(r["num_turns"]),
            str(r["num_new_tokens"]),
            f"{r['tree_tokens_per_step']:.1f}",
            f"{r['draft_ms_per_step']:.1f}",
            f"{r['verify_ms_per_step']:.1f}",
            f"{r['baseline_ms_per_token']:.1f}",
            f"{r['step_cost_greedy_steps']:.2f}",
        ]
        vals += [f"{r[b]['tau']:.2f}" for b in baselines] + [f"{r[b]['speedup']:.2f}×" for b in baselines]
        return f"| {name} | " + " | ".join(vals) + " |"

    lines.append(row("**all**", report))
    for cat, r in report.get("per_category", {}).items():
        lines.append(row(cat, r))
    if report.get("time_split_s"):
        lines += ["", f"Speculative decoding's {split_line(report)}."]
    if report.get("sampling"):
        from draftheads.decode.sampling_eval import format_rows

        note = "Sampling, each prompt's first turn (lossless rejection sampling; against sampling `generate` on that backend):"
        lines += ["", note, "", format_rows(report["sampling"])]
    path.write_text("\n".join(lines) + "\n")


def write_report(report: dict[str, Any], results: list[TurnResult], baselines: list[str], out: Path) -> None:
    """``report.json``, ``turns.jsonl``, ``report.md`` and the plots, into the directory ``out``."""
    from draftheads.decode.plots import write_plots

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "turns.jsonl").write_text("".join(json.dumps(vars(r)) + "\n" for r in results))
    write_markdown(report, baselines, out / "report.md")
    write_plots(report, out)


def summary_line(report: dict[str, Any], baselines: list[str]) -> str:
    """One line: τ, speedup, tokens/s, greedy identity and each baseline's τ and speedup."""
    line = (
        f"τ {report['tau']:.2f}  speedup {report['speedup_vs_stock']:.2f}× vs stock generate, "
        f"{report['speedup']:.2f}× vs plain {report.get('baseline', 'generate')} on {report['backend']} "
        f"({report['tokens_per_s']:.1f} vs {report['stock_tokens_per_s']:.1f} / "
        f"{report['baseline_tokens_per_s']:.1f} tok/s)  step {report['step_cost_greedy_steps']:.2f} greedy steps  "
        f"greedy identical {report['greedy_identical']:.2f} (stock {report['identical_to_stock']:.2f})  "
        f"on {report['num_turns']} turns"
    )
    for b in baselines:
        line += f"  | {b}: τ {report[b]['tau']:.2f} speedup {report[b]['speedup']:.2f}×"
    return line


def split_line(report: dict[str, Any]) -> str:
    """One line: where the speculative runs' wall time went, part by part (they add up to it)."""
    parts = report.get("time_split_s") or {}
    total = sum(parts.values())
    shown = ", ".join(f"{k} {v:.2f}s" for k, v in parts.items() if v >= 0.005 or k != "outside")
    return f"time {total:.2f}s: {shown}" if parts else ""
