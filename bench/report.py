"""The benchmark's summary lines, its scaling plot, and the measured section of its docs page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftheads.bench.figures import write_figures
from draftheads.bench.workload_stage import workload_lines
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.bench_drafters import row_base


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
                f"generate, {r['speedup']:.2f}× vs plain {r.get('baseline', 'generate')} on {r.get('backend', 'eager')}  "
                f"({r['tokens_per_s']:.1f} vs {r.get('stock_tokens_per_s', 0.0):.1f} / "
                f"{r['baseline_tokens_per_s']:.1f} tok/s)  greedy identical {r['greedy_identical']:.2f}"
            )
            if "pld" in r:
                line += f"  | prompt lookup τ {r['pld']['tau']:.2f} speedup {r['pld']['speedup']:.2f}×"
            lines.append(line)
    lines += workload_lines(results.get("workloads", {}))
    for kind, r in results.get("drafter_only", {}).items():
        lines.append(f"{kind:<7} heldout     τ {r['tau']:.2f}, drafter only (no lookup branch, no planner)")
    for p in results.get("scaling", []):
        lines.append(f"scaling: {p['answer_tokens']} answer tokens -> τ {p['tau']:.2f}")
    for name, r in results.get("ablations", {}).items():
        lines.append(f"ablation {name}: τ {r['tau']:.2f}")
    for name, r in results.get("variants", {}).items():
        with_defaults = f"; {defaults_cell(r)} with the decoder's defaults" if "defaults" in r else ""
        lines.append(f"variant {name}: τ {r['tau']:.2f}, drafter only{with_defaults}")
    return "\n".join(lines)


def write_docs(results: dict[str, Any], b: BenchConfig, path: Path) -> None:
    """The measured section of ``docs/benchmarks.md`` (rewritten by every bench run), results
    first and tables only: acceptance and speed per prompt set with prompt lookup beside the
    drafters, Spec-Bench per category, the opt-in scaling and ablation rows, then training and
    stage times. The settings and every figure go to ``benchmarks.json`` beside the page, the
    raw results to ``results.json`` in ``bench.out_dir``."""
    # the optional data folder is named by role, not by this machine's path
    settings = {**vars(b), "shared_data": "DATA_DIR" if b.shared_data else ""}
    figures_file = path.with_suffix(".json")
    lines = [
        *speed_lines(results, b, figures_file.name),
        *study_lines(results, b),
        *training_lines(results),
        "",
        "Reproduce: `make bench` (or `draftheads bench bench.out_dir=outputs/bench`); stages are cached "
        "under `bench.out_dir`, so a rerun skips what is done, and a stage done under other settings "
        "stops the rerun with the folder to delete.",
    ]
    replace_section(path, "\n".join(lines))
    write_figures(results, settings, figures_file)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table without the columns that are blank in every row."""
    keep = [i for i in range(len(header)) if any(row[i] for row in rows)] if rows else range(len(header))
    return [
        "| " + " | ".join(header[i] for i in keep) + " |",
        "|" + "---|" * len(keep),
        *("| " + " | ".join(row[i] for i in keep) + " |" for row in rows),
    ]


def run_line(results: dict[str, Any], b: BenchConfig, figures_name: str) -> str:
    """What ran: the command, hardware, versions and this invocation's time."""
    env = next(
        (
            r["environment"]
            for reps in results["drafters"].values()
            for r in reps.values()
            if "environment" in r
        ),
        {},
    )
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
    return (
        f"`{results.get('command', 'draftheads bench')}` on {env.get('cpu', '?')}, {env.get('cpu_count', '?')} "
        f"cores (torch threads {env.get('torch_threads', '?')}, device {env.get('device', '?')}); {versions}; "
        f"{results.get('seconds', 0) / 60:.0f} min for this invocation (stages cached by an earlier one are "
        f"skipped, not counted). Greedy, batch 1, {b.eval_new_tokens} new tokens, the embedded "
        "SmolLM2-135M-Instruct target in fp32; every drafter and baseline decodes the same turns in one "
        f"process. The settings and every figure: [`{figures_name}`]({figures_name})."
    )


def speed_lines(results: dict[str, Any], b: BenchConfig, figures_name: str) -> list[str]:
    """Acceptance and speed per prompt set (each drafter, then transformers' prompt lookup), then
    Spec-Bench per category, one column per drafter."""
    reps = results["drafters"]
    nan = float("nan")
    backends = sorted({r.get("backend", "eager") for reports in reps.values() for r in reports.values()})
    sets = list(dict.fromkeys(name for reports in reps.values() for name in reports))
    rows = []
    for name in sets:
        here = {kind: reports[name] for kind, reports in reps.items() if name in reports}
        for kind, r in here.items():
            rows.append(
                [
                    kind,
                    name,
                    str(r["num_turns"]),
                    f"{r['tau']:.2f}",
                    f"{r['speedup']:.2f}×",
                    f"{r.get('speedup_vs_stock', nan):.2f}×",
                    f"{r['tokens_per_s']:.1f}",
                    f"{r.get('retiring_tokens_per_s') or nan:.1f} / {r.get('generate_tokens_per_s', nan):.1f}",
                    f"{r.get('stock_tokens_per_s', nan):.1f}",
                    f"{r.get('step_cost_greedy_steps', nan):.2f}",
                    f"{r.get('draft_cost_greedy_steps', nan):.2f}",
                    f"{r['greedy_identical']:.2f}",
                ]
            )
        pld = next(((r["pld"], r["num_turns"]) for r in here.values() if r.get("pld")), None)
        if pld:
            p, turns = pld
            tps = f"{p['tokens_per_s']:.1f}" if p.get("tokens_per_s") else ""
            rows.append(
                ["prompt lookup", name, str(turns), f"{p['tau']:.2f}", "", f"{p['speedup']:.2f}×", tps]
                + [""] * 5
            )
    lines = [
        "### Acceptance and speed: the recorded run",
        "",
        run_line(results, b, figures_name)
        + f" Plain: the faster greedy loop on the decoder's backend ({', '.join(backends)}), `generate` or the "
        "retiring batched loop (both loops' tokens/s shown); step cost and drafting are in greedy steps on it. "
        "Prompt lookup is transformers' (`prompt_lookup_num_tokens=10`), on stock `generate`.",
        "",
        *table(
            [
                "drafter",
                "prompt set",
                "turns",
                "τ",
                "vs plain",
                "vs stock",
                "tok/s",
                "tok/s retiring / generate",
                "stock tok/s",
                "step cost",
                "drafting",
                "greedy identical",
            ],
            rows,
        ),
    ]
    alone = results.get("drafter_only") or {}
    if alone:
        taus = ", ".join(f"{kind} {r['tau']:.2f}" for kind, r in alone.items())
        lines += [
            "",
            f"Held-out τ with each drafter's own tree alone (`bench.drafter_only`: no lookup branch, "
            f"no planner, as the ablation rows' *drafter only*): {taus}.",
        ]
    spec = {name: reports["spec_bench"] for name, reports in reps.items() if "spec_bench" in reports}
    names = [name for name, r in spec.items() if r.get("per_category")]
    if not names:
        return lines
    pcats = next((r.get("per_category", {}) for r in spec.values() if r.get("pld")), {})
    with_pld = any(c.get("pld") for c in pcats.values())
    cats = list(dict.fromkeys(c for name in names for c in spec[name]["per_category"]))
    rows = []
    for cat in cats:
        cells = [cat]
        for name in names:
            r = spec[name]["per_category"].get(cat)
            cells.append(f"{r['tau']:.2f} / {r['speedup']:.2f}×" if r else "")
        if with_pld:
            ps = pcats.get(cat, {}).get("pld", {}).get("speedup")
            cells.append(f"{ps:.2f}×" if ps is not None else "")
        rows.append(cells)
    header = ["category", *(f"{name}: τ / vs plain" for name in names)]
    header += ["prompt lookup vs stock"] if with_pld else []
    return lines + ["", "#### Spec-Bench per category", "", *table(header, rows)]


def training_lines(results: dict[str, Any]) -> list[str]:
    """Every stage's minutes (one row), then what each drafter trained on and the feature caches."""
    lines = ["", "### Training and stage times: the recorded run"]
    stages = results.get("stage_minutes") or {}
    if stages:
        known = [m for m in stages.values() if m is not None]
        total = f"{sum(known):.1f}" + ("" if len(known) == len(stages) else " (recorded stages only)")
        lines += [
            "",
            *table(
                [*stages, "**all stages**"],
                [[*("not recorded" if m is None else f"{m:.1f}" for m in stages.values()), f"**{total}**"]],
            ),
        ]
    trained = []
    for kind, t in results["train"].items():
        what = [f"{t['steps']} steps"] if t.get("steps") else []
        what += [f"{t['epochs']:.2f} epochs"] if t.get("epochs") is not None else []
        what += [f"{t.get('answer_tokens')} answer tokens", f"{t.get('seconds', 0) / 60:.1f} min"]
        trained.append(f"{kind}: {', '.join(what)}")
    text = [f"Minutes per stage; trained: {'; '.join(trained)}."] if trained else []
    data = results.get("data")
    if data:
        minutes = f", {data['seconds'] / 60:.1f} min" if data.get("seconds") else ""
        text.append(
            f"Teacher-forced feature cache: {data.get('rows')} rows, {data.get('answer_tokens')} distinct "
            f"answer tokens{minutes}."
        )
    mix = results.get("mixture")
    if mix:
        text.append(
            f"Self-distilled answers beside it: {mix.get('rows')} rows, {mix['distilled_tokens']} answer "
            f"tokens, {mix['distill_repeats']} pass{'es' if mix['distill_repeats'] != 1 else ''} each per pass "
            "over the teacher-forced text, in the streamed main drafters' data only."
        )
    return lines + (["", " ".join(text)] if text else [])


def study_lines(results: dict[str, Any], b: BenchConfig) -> list[str]:
    """The opt-in rows: τ against distinct training data at equal compute, and the recipe ablations."""
    lines = []
    if results["scaling"]:
        rows = [
            [
                str(p["answer_tokens"]),
                "" if p.get("epochs") is None else f"{p['epochs']:.2f}",
                str(p.get("steps") or ""),
                f"{p['seconds'] / 60:.1f}" if p.get("seconds") else "",
                f"{p['tau']:.2f}",
            ]
            for p in results["scaling"]
        ]
        lines += [
            "",
            "### τ against training data: the recorded run",
            "",
            f"The row base's recipe ({row_base().name}) on the first N distinct teacher-forced answer "
            "tokens, every point at the same compute (answer tokens × epochs), τ on the held-out prompts. "
            f"Plot: `{Path(b.out_dir) / 'scaling.png'}`.",
            "",
            *table(["answer tokens", "epochs", "steps", "training minutes", "τ"], rows),
        ]
    if results.get("ablations"):
        lines += [
            "",
            "### Recipe ablations: the recorded run",
            "",
            "One switch per row, on the same teacher-forced answer tokens, held-out τ with the decoder's "
            "defaults."
            + (
                " Simulated τ and position 1 come from a row's last evaluation on its held-out rows, and "
                "drafting is the drafter's time per drafting step in greedy steps."
                if any(r.get("eval") or r.get("draft_greedy_steps") for r in results["ablations"].values())
                else ""
            ),
            "",
            *table(ROW_HEADER, [ablation_cells(name, r) for name, r in results["ablations"].items()]),
        ]
    if results.get("variants"):
        lines += [
            "",
            "### Recipe rows at full data: the recorded run",
            "",
            "Rows trained on the main drafters' own data and passes (`bench.variants`), held-out τ "
            "with the drafter's own tree alone (no lookup branch, no planner), as the main drafters' "
            "drafter-only τ above, and with the decoder's defaults, as the main drafters' held-out τ.",
            "",
            *table(
                [*ROW_HEADER, "τ, decoder's defaults"],
                [[*ablation_cells(name, r), defaults_cell(r)] for name, r in results["variants"].items()],
            ),
        ]
    return lines


# the columns of an ablation or variant row (:func:`ablation_cells`)
ROW_HEADER = [
    "row",
    "overrides",
    "data",
    "answer tokens",
    "epochs",
    "training minutes",
    "simulated τ",
    "position 1 top-1",
    "drafting, greedy steps",
    "τ",
]


def ablation_cells(name: str, r: dict[str, Any]) -> list[str]:
    """One ablation row's cells; blanks for figures a row (or an older record) lacks."""
    over = " ".join(r.get("overrides", [])) or "(bench recipe)"
    ev = r.get("eval") or {}
    first = ev.get("pos1/acc_top1", ev.get("step0/acc_top1"))  # the first drafted token
    return [
        name,
        f"`{over}`",
        r.get("data", ""),
        str(r["answer_tokens"]),
        f"{r['epochs']:.2f}",
        f"{r['seconds'] / 60:.1f}" if r.get("seconds") else "",
        f"{ev['tau']:.2f}" if "tau" in ev else "",
        f"{100 * first:.1f}%" if first is not None else "",
        f"{r['draft_greedy_steps']:.3f}" if r.get("draft_greedy_steps") is not None else "",
        f"{r['tau']:.2f}",
    ]


def defaults_cell(r: dict[str, Any]) -> str:
    """A variant's held-out τ with the decoder's defaults; blank in an older record without it."""
    return f"{r['defaults']['tau']:.2f}" if "defaults" in r else ""


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
