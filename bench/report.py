"""The benchmark's summary lines, its scaling plot, and the measured section of its docs page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftheads.conf.commands.checks import writable_file
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig
from draftheads.data.outdir import read_json


def scaling_plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([p["answer_tokens"] for p in points], [p["tau"] for p in points], marker="o")
    ax.set(
        xscale="log",
        xlabel="training answer tokens",
        ylabel="τ on held-out prompts",
        title="τ against training data",
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_lines(results: dict[str, Any]) -> str:
    lines = []
    for kind, reports in results["drafters"].items():
        for name, r in reports.items():
            line = (
                f"{kind:<7} {name:<11} τ {r['tau']:.2f}  speedup {r.get('speedup_vs_stock', 0.0):.2f}× vs stock "
                f"generate, {r['speedup']:.2f}× vs greedy on {r.get('backend', 'eager')}  "
                f"({r['tokens_per_s']:.1f} vs {r.get('stock_tokens_per_s', 0.0):.1f} / "
                f"{r['baseline_tokens_per_s']:.1f} tok/s)  greedy identical {r['greedy_identical']:.2f}"
            )
            if "pld" in r:
                line += f"  | prompt lookup τ {r['pld']['tau']:.2f} speedup {r['pld']['speedup']:.2f}×"
            lines.append(line)
    for p in results.get("scaling", []):
        lines.append(f"scaling: {p['answer_tokens']} answer tokens -> τ {p['tau']:.2f}")
    for name, r in results.get("ablations", {}).items():
        lines.append(f"ablation {name}: τ {r['tau']:.2f}")
    return "\n".join(lines)


def write_docs(results: dict[str, Any], b: BenchConfig, path: Path) -> None:
    """docs/benchmarks.md from the measured results (overwritten by every bench run): what ran,
    then acceptance and speed (what a reader looks for first), then training, stage times and the
    opt-in scaling and ablation rows."""
    # the optional data folder is named by role, not by this machine's path
    settings = {**vars(b), "shared_data": "DATA_DIR" if b.shared_data else ""}
    lines = [
        *run_lines(results, settings),
        *speed_lines(results),
        *training_lines(results),
        *study_lines(results, b),
        "",
        "Reproduce: `make bench` (or `draftheads bench bench.out_dir=outputs/bench`); stages are cached "
        "under `bench.out_dir`, so a rerun skips what is done, and a stage done under other settings "
        "stops the rerun with the folder to delete.",
    ]
    replace_section(path, "\n".join(lines))
    write_figures(results, settings, path.with_suffix(".json"))


def run_lines(results: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The section's title and what ran: target, hardware, versions, time and settings."""
    env = next((r["environment"] for reps in results["drafters"].values() for r in reps.values()), {})
    return [
        "## Measured results",
        "",
        "Measured by `make bench` (`draftheads bench`), greedy, batch 1, on the embedded SmolLM2-135M-Instruct "
        "target in fp32. Every number below comes from one run; speedups compare, in that same run and on the "
        "same prompts, against the target's plain greedy `generate` and transformers' prompt lookup decoding "
        "(`prompt_lookup_num_tokens=10`).",
        "",
        f"- Hardware: {env.get('cpu', '?')}, {env.get('cpu_count', '?')} cores, torch threads "
        f"{env.get('torch_threads', '?')}, device {env.get('device', '?')}",
        f"- Versions: {json.dumps(env.get('versions', {}))}",
        f"- This invocation: {results['seconds'] / 60:.0f} min (stages cached by an earlier one are "
        f"skipped, not counted). Settings: `{json.dumps(settings)}`",
    ]


def speed_lines(results: dict[str, Any]) -> list[str]:
    """Acceptance and speed per drafter and prompt set, then Spec-Bench per category."""
    pld = {name: r["pld"] for reps in results["drafters"].values() for name, r in reps.items() if "pld" in r}
    lines = [
        "",
        "### Acceptance and speed",
        "",
        "Speedups are against stock transformers `generate` and against greedy decoding on the "
        "decoder's own backend (`backend`); a step's cost is in greedy steps on that backend; prompt "
        "lookup is transformers' (`prompt_lookup_num_tokens=10`), against stock `generate`.",
        "",
        "| drafter | prompt set | τ | vs stock | vs greedy | backend | tok/s | stock tok/s | greedy tok/s |"
        " step cost | drafting | greedy identical | turns | prompt lookup τ | prompt lookup vs stock |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for kind, reports in results["drafters"].items():
        for name, r in reports.items():
            p = pld.get(name, {})
            lines.append(
                f"| {kind} | {name} | {r['tau']:.2f} | {r.get('speedup_vs_stock', nan):.2f}× | "
                f"{r['speedup']:.2f}× | {r.get('backend', 'eager')} | {r['tokens_per_s']:.1f} | "
                f"{r.get('stock_tokens_per_s', nan):.1f} | {r['baseline_tokens_per_s']:.1f} | "
                f"{r.get('step_cost_greedy_steps', nan):.2f} | {r.get('draft_cost_greedy_steps', nan):.2f} | "
                f"{r['greedy_identical']:.2f} | {r['num_turns']} | "
                f"{p.get('tau', nan):.2f} | {p.get('speedup', nan):.2f}× |"
            )
    pcats = (
        next(
            (r for r in results["drafters"].values() if "spec_bench" in r and "pld" in r["spec_bench"]),
            {},
        )
        .get("spec_bench", {})
        .get("per_category", {})
    )
    for kind, reports in results["drafters"].items():
        cats = reports.get("spec_bench", {}).get("per_category")
        if not cats:
            continue
        lines += [
            "",
            f"#### Spec-Bench per category: {kind}",
            "",
            "| category | τ | speedup | prompt lookup speedup |",
            "|---|---|---|---|",
        ]
        for cat, r in cats.items():
            ps = pcats.get(cat, {}).get("pld", {}).get("speedup", nan)
            lines.append(f"| {cat} | {r['tau']:.2f} | {r['speedup']:.2f}× | {ps:.2f}× |")
    return lines


def training_lines(results: dict[str, Any]) -> list[str]:
    """What each drafter trained on and for how long, the feature caches, and every stage's minutes."""
    lines = [
        "",
        "### Training",
        "",
        "| drafter | steps | epochs | answer tokens | minutes |",
        "|---|---|---|---|---|",
    ]
    for kind, t in results["train"].items():
        epochs = "" if t.get("epochs") is None else f"{t['epochs']:.2f}"
        lines.append(
            f"| {kind} | {t.get('steps') or ''} | {epochs} | {t.get('answer_tokens')} | "
            f"{t.get('seconds', 0) / 60:.1f} |"
        )
    data = results.get("data")
    if data:
        minutes = f", {data['seconds'] / 60:.1f} min" if data.get("seconds") else ""
        lines += [
            "",
            f"Teacher-forced feature cache: {data.get('rows')} rows, {data.get('answer_tokens')} distinct "
            f"answer tokens{minutes}.",
        ]
    mix = results.get("mixture")
    if mix:
        lines += [
            "",
            f"Self-distilled answers beside it: {mix.get('rows')} rows, {mix['distilled_tokens']} answer "
            f"tokens, {mix['distill_repeats']} pass{'es' if mix['distill_repeats'] != 1 else ''} each per pass "
            "over the teacher-forced text, in the "
            "main EAGLE-3 drafter's data only.",
        ]
    stages = results.get("stage_minutes") or {}
    if stages:
        known = [m for m in stages.values() if m is not None]
        lines += ["", "### Stage times", "", "| stage | minutes |", "|---|---|"]
        lines += [f"| {name} | {'not recorded' if m is None else f'{m:.1f}'} |" for name, m in stages.items()]
        total = f"{sum(known):.1f}" + ("" if len(known) == len(stages) else " (recorded stages only)")
        lines.append(f"| **all stages** | **{total}** |")
    return lines


def study_lines(results: dict[str, Any], b: BenchConfig) -> list[str]:
    """The opt-in rows: τ against distinct training data at equal compute, and the recipe ablations."""
    lines = []
    if results["scaling"]:
        lines += [
            "",
            "### τ against training data (EAGLE drafter, held-out prompts)",
            "",
            "Distinct answer tokens against epochs; with teacher-forced data every point has the same "
            "compute (answer tokens x epochs).",
            "",
            "| answer tokens | epochs | steps | training minutes | τ |",
            "|---|---|---|---|---|",
        ]
        for p in results["scaling"]:
            epochs = "" if p.get("epochs") is None else f"{p['epochs']:.2f}"
            minutes = f"{p['seconds'] / 60:.1f}" if p.get("seconds") else ""
            lines.append(
                f"| {p['answer_tokens']} | {epochs} | {p.get('steps') or ''} | {minutes} | {p['tau']:.2f} |"
            )
        lines += ["", f"Plot: `{Path(b.out_dir) / 'scaling.png'}`."]
    if results.get("ablations"):
        lines += [
            "",
            "### Recipe ablations (equal data and compute, held-out prompts)",
            "",
            "τ is the decoder's on the held-out prompts; simulated τ and position 1 come from the run's "
            "last evaluation on its held-out rows (a top-1 chain, or a drafted block, at every answer "
            "position); drafting is the drafter's time per drafting step in 1-token greedy steps.",
            "",
            "| row | overrides | data | answer tokens | epochs | training minutes | simulated τ "
            "| position 1 top-1 | drafting, greedy steps | τ |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in results["ablations"].items():
            lines.append(ablation_line(name, r))
    return lines


def ablation_line(name: str, r: dict[str, Any]) -> str:
    """One ablation row of the table; blanks for figures a row (or an older record) lacks."""
    over = " ".join(r.get("overrides", [])) or "(bench recipe)"
    ev = r.get("eval") or {}
    first = ev.get("pos1/acc_top1", ev.get("step0/acc_top1"))  # the first drafted token
    cells = [
        name,
        f"`{over}`",
        r.get("data", "teacher"),
        str(r["answer_tokens"]),
        f"{r['epochs']:.2f}",
        f"{r['seconds'] / 60:.1f}" if r.get("seconds") else "",
        f"{ev['tau']:.2f}" if "tau" in ev else "",
        f"{100 * first:.1f}%" if first is not None else "",
        f"{r['draft_greedy_steps']:.3f}" if r.get("draft_greedy_steps") is not None else "",
        f"{r['tau']:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


def figures(results: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the tables: training, acceptance and speed per drafter and prompt set,
    Spec-Bench per category, the scaling points and the ablation rows."""
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
                "pld": {k: r["pld"].get(k) for k in ("tau", "speedup")} if "pld" in r else None,
                "per_category": {
                    c: {k: v.get(k) for k in ("tau", "speedup")}
                    for c, v in (r.get("per_category") or {}).items()
                },
            }
            for name, r in reports.items()
        }
        for kind, reports in results["drafters"].items()
    }
    return {
        "train": results["train"],
        "data": results.get("data"),
        "mixture": results.get("mixture"),
        "drafters": drafters,
        "scaling": results.get("scaling", []),
        "ablations": results.get("ablations", {}),
        "stage_minutes": results.get("stage_minutes", {}),
        "seconds": results.get("seconds"),
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
KEPT_KEYS = ("workloads", "reduced_runs")


def write_figures(results: dict[str, Any], settings: dict[str, Any], path: Path) -> None:
    """``docs/benchmarks.json``: the figures of ``docs/benchmarks.md`` with the command and settings.
    What other runs recorded there is kept: the ``workloads`` rows of ``draftheads speed
    speed.workloads=true`` and the ``reduced_runs`` (smaller benches, each with its own command)."""
    record = {"command": results.get("command", "draftheads bench"), "settings": settings, **figures(results)}
    earlier = read_json(path) if path.exists() else None
    for key in KEPT_KEYS:
        if isinstance(earlier, dict) and key in earlier:
            record[key] = earlier[key]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")


BEGIN, END = "<!-- bench:begin (written by draftheads bench) -->", "<!-- bench:end -->"


def replace_section(path: Path, body: str) -> None:
    """Write ``body`` between the bench markers of ``path``, keeping the hand-written rest."""
    text = path.read_text() if path.is_file() else ""
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
