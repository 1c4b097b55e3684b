"""The bench's docs page and figures file: the measured section, written from results alone."""

from __future__ import annotations

import json

from draftheads.bench.report import BEGIN, END, replace_section, write_docs
from draftheads.conf.cli import parse


def toy_report(tau: float, pld: bool, **more) -> dict:
    """One drafter's report on one prompt set, as the evaluation writes it."""
    r = dict(
        tau=tau,
        speedup=1.5,
        speedup_vs_stock=1.8,
        backend="onednn",
        tokens_per_s=30.0,
        baseline_tokens_per_s=20.0,
        stock_tokens_per_s=16.0,
        step_cost_greedy_steps=1.4,
        draft_cost_greedy_steps=0.2,
        greedy_identical=1.0,
        num_turns=3,
        environment={
            "cpu": "Toy CPU",
            "cpu_count": 2,
            "torch_threads": 2,
            "device": "cpu",
            "decode": {"x": 1},
        },
        **more,
    )
    if pld:
        r["pld"] = {"tau": 1.7, "speedup": 1.1, "tokens_per_s": 17.6}
    return r


def test_the_measured_section_is_results_first_and_tables_only(tmp_path):
    """Prompt lookup is a row of each prompt set beside the drafters, Spec-Bench per category is one
    table with a column per drafter, blank columns are left out, and the figures file beside the
    page holds prompt lookup per category and the hardware (not the decode settings)."""
    cats = {c: {"tau": 2.0, "speedup": 1.2, "pld": {"tau": 1.5, "speedup": 0.9}} for c in ("coding", "qa")}
    results = {
        "command": "draftheads bench bench.out_dir=outputs/x",
        "seconds": 600.0,
        "drafters": {
            "medusa": {
                "heldout": toy_report(1.9, True),
                "spec_bench": toy_report(1.6, True, per_category=cats),
            },
            "eagle3": {
                "heldout": toy_report(2.7, False),
                "spec_bench": toy_report(2.2, False, per_category=cats),
            },
        },
        "train": {"medusa": {"steps": 4, "answer_tokens": 100, "seconds": 60.0}},
        "scaling": [
            {"answer_tokens": 50, "epochs": 2.0, "tau": 1.5},
            {"answer_tokens": 100, "epochs": 1.0, "tau": 1.6},
        ],
        "ablations": {
            "eagle3 ttt 7": {
                "overrides": ["draft.eagle.ttt_steps=7"],
                "answer_tokens": 50,
                "epochs": 1.0,
                "tau": 2.1,
            }
        },
        "stage_minutes": {"distill": 1.0, "train medusa": 2.0},
    }
    b = parse(["bench", "target=tiny-llama"]).args.bench
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nHand-written analysis stays.\n")
    write_docs(results, b, docs)
    text = docs.read_text()
    section = text[text.index(BEGIN) : text.index(END)]
    assert (
        "Hand-written analysis stays." in text
        and "`draftheads bench bench.out_dir=outputs/x` on Toy CPU" in section
    )
    rows = [line for line in section.splitlines() if line.startswith("| ") and "heldout" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| medusa", "| eagle3", "| prompt lookup"]
    assert "| prompt lookup | spec_bench | 3 | 1.70 |  | 1.10× | 17.6 |" in section
    assert "| category | medusa: τ / vs plain | eagle3: τ / vs plain | prompt lookup vs stock |" in section
    assert "| coding | 2.00 / 1.20× | 2.00 / 1.20× | 0.90× |" in section
    # blank in every row: the scaling points' steps and minutes, the ablation row's simulated figures
    assert "| answer tokens | epochs | τ |" in section and "| 50 | 2.00 | 1.50 |" in section
    assert "| row | overrides | answer tokens | epochs | τ |" in section
    assert "| eagle3 ttt 7 | `draft.eagle.ttt_steps=7` | 50 | 1.00 | 2.10 |" in section
    assert "| distill | train medusa | **all stages** |" in section and "| 1.0 | 2.0 | **3.0** |" in section
    assert "trained: medusa: 4 steps, 100 answer tokens, 1.0 min." in section
    record = json.loads(docs.with_suffix(".json").read_text())
    spec = record["drafters"]["medusa"]["spec_bench"]
    assert spec["per_category"]["coding"]["pld"] == {"tau": 1.5, "speedup": 0.9}
    assert spec["pld"]["tokens_per_s"] == 17.6 and record["drafters"]["eagle3"]["heldout"]["pld"] is None
    assert record["environment"]["cpu"] == "Toy CPU" and "decode" not in record["environment"]


def test_replace_section_keeps_the_rest(tmp_path):
    p = tmp_path / "x.md"
    replace_section(p, "one")
    p.write_text("intro\n" + p.read_text() + "outro\n")
    replace_section(p, "two")
    assert p.read_text() == f"intro\n{BEGIN}\ntwo\n{END}\noutro\n"
