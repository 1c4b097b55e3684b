"""draftheads eval: the report's arithmetic, and an end-to-end run on a tiny target."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.cli import main
from draftheads.decode.evaluate import TurnResult
from draftheads.decode.report import summarize
from draftheads.decode.stats import PARTS
from draftheads.heads import EagleDrafter, MedusaHeads


def turn(
    pid: str, cat: str, lengths: list[int], spec_s: float, base_s: float, same: bool = True
) -> TurnResult:
    return TurnResult(
        prompt_id=pid,
        category=cat,
        new_tokens=sum(lengths),
        spec_time_s=spec_s,
        base_time_s=base_s,
        target_forwards=len(lengths) + 1,
        accepted_lengths=lengths,
        identical=same,
        draft_time_s=0.1 * len(lengths),
        verify_time_s=0.2 * len(lengths),
        stock_time_s=1.5 * base_s,
        identical_stock=same and pid != "a",
        tree_tokens=[4] * len(lengths),
        backend="onednn",
        baselines={
            "pld": {
                "time_s": base_s * 2,
                "new_tokens": sum(lengths) + 1,  # the prefill's token too, as generate counts
                "target_forwards": sum(lengths) // 2 + 1,
            }
        },
    )


def test_summary_arithmetic_matches_a_hand_computed_example():
    rs = [turn("a", "math", [1, 3, 2], 1.0, 3.0), turn("b", "code", [4, 1], 2.0, 2.0, same=False)]
    rep = summarize(rs, ["pld"])
    # 11 tokens over 5 steps
    assert rep["tau"] == pytest.approx(11 / 5)
    # position i accepted when a step took more than i+1 tokens: >1: 3 of 5, >2: 2 of 5, >3: 1 of 5
    assert rep["per_position_acceptance"] == pytest.approx([3 / 5, 2 / 5, 1 / 5])
    assert rep["speedup"] == pytest.approx(5.0 / 3.0)
    assert rep["tokens_per_s"] == pytest.approx(11 / 3.0) and rep["baseline_tokens_per_s"] == pytest.approx(
        11 / 5.0
    )
    assert rep["greedy_identical"] == 0.5 and rep["num_prompts"] == 2 and rep["num_new_tokens"] == 11
    assert rep["accepted_length_histogram"] == {"1": 2, "2": 1, "3": 1, "4": 1}
    # 0.5 s of drafting and 1.0 s of verifying over 5 steps; the baseline took 5 s for 11 tokens
    assert rep["draft_ms_per_step"] == pytest.approx(100.0) and rep["verify_ms_per_step"] == pytest.approx(
        200.0
    )
    assert rep["baseline_ms_per_token"] == pytest.approx(5000 / 11)
    # pld: 13 tokens, 2 of them the prefills'; forwards (6//2+1)+(5//2+1) = 7, minus 2 prefills = 5 steps
    # stock generate took 1.5 x 5 s: we are 7.5 / 3 = 2.5x faster; pld (10 s) 0.75x of stock
    assert rep["pld"]["tau"] == pytest.approx(11 / 5) and rep["pld"]["speedup"] == pytest.approx(0.75)
    assert rep["speedup_vs_stock"] == pytest.approx(2.5) and rep["stock_tokens_per_s"] == pytest.approx(
        11 / 7.5
    )
    assert (
        rep["backend"] == "onednn" and rep["identical_to_stock"] == 0.0 and rep["tree_tokens_per_step"] == 4
    )
    # a step (0.3 s) against a greedy token (5/11 s): 0.66 greedy steps; drafting 0.22 of them
    assert rep["step_cost_greedy_steps"] == pytest.approx(0.3 / (5 / 11))
    assert rep["draft_cost_greedy_steps"] == pytest.approx(0.1 / (5 / 11))
    assert set(rep["per_category"]) == {"code", "math"} and rep["per_category"]["math"][
        "tau"
    ] == pytest.approx(2.0)


def test_the_speedup_is_against_the_faster_plain_loop_with_both_rates_reported():
    rs = [turn("a", "math", [1, 3, 2], 1.0, 3.0), turn("b", "code", [4, 1], 2.0, 2.0)]
    for r, s in zip(rs, (2.0, 2.0)):
        r.retiring_time_s = s
    rep = summarize(rs, [])
    # 11 tokens: generate took 5 s, the retiring loop 4 s; the speculative runs 3 s
    assert rep["baseline"] == "retiring" and rep["speedup"] == pytest.approx(4.0 / 3.0)
    assert rep["generate_tokens_per_s"] == pytest.approx(11 / 5.0)
    assert rep["retiring_tokens_per_s"] == rep["baseline_tokens_per_s"] == pytest.approx(11 / 4.0)
    rs[0].retiring_time_s = 4.0  # now 6 s: slower than generate, which stays the baseline
    rep = summarize(rs, [])
    assert rep["baseline"] == "generate" and rep["speedup"] == pytest.approx(5.0 / 3.0)
    rs[1].retiring_time_s = None  # a turn without it: generate alone
    assert summarize(rs, [])["retiring_tokens_per_s"] is None


@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
def test_eval_end_to_end_on_a_tiny_target(tmp_path, tiny_llama, kind, capsys):
    model, tok, fp = tiny_llama
    if kind == "medusa":
        drafter = MedusaHeads(fp, num_heads=2)
    else:
        drafter = EagleDrafter(fp, target_config=model.config.to_dict(), version=3, draft_vocab_size=1000)
    drafter.save_pretrained(tmp_path / "heads")
    argv = [
        "eval",
        "target=tiny-llama",
        f"heads={tmp_path / 'heads'}",
        "eval.max_prompts=2",
        "decode.max_new_tokens=12",
        f"eval.out_dir={tmp_path / 'eval'}",
        "eval.warmup=0",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "τ" in printed.out and "sampling: T=0.7: τ" in printed.out and "T=1.0: τ" in printed.out
    on_disk = json.loads((tmp_path / "eval" / "report.json").read_text())
    # sampling beside greedy, at the default temperatures, on the same backend
    assert [r["temperature"] for r in on_disk["sampling"]] == [0.7, 1.0]
    for r in on_disk["sampling"]:
        assert r["tau"] >= 1.0 and r["tokens_per_s"] > 0 and r["baseline_tokens_per_s"] > 0
        # both plain sampling loops ran; the speedup is against the faster
        assert r["baseline_tokens_per_s"] == max(r["generate_tokens_per_s"], r["retiring_tokens_per_s"])
        assert r["backend"] == on_disk["backend"] and r["num_new_tokens"] > 0
    choice = on_disk["environment"]["backend_choice"]
    if choice is not None:  # a float32 CPU with oneDNN: the target's backend was timed, and printed
        assert choice["name"] == on_disk["backend"] and set(choice["seconds"]) == {"eager", "onednn"}
        assert "backend for the target:" in printed.err
    assert on_disk["greedy_identical"] == 1.0 and on_disk["num_prompts"] == 2 and on_disk["tau"] >= 1.0
    rates = (on_disk["generate_tokens_per_s"], on_disk["retiring_tokens_per_s"])
    assert on_disk["baseline_tokens_per_s"] == pytest.approx(max(rates)) and min(rates) > 0
    assert on_disk["environment"]["versions"]["torch"] and "pld" in on_disk
    for key in (
        "tau",
        "per_position_acceptance",
        "tokens_per_s",
        "baseline_tokens_per_s",
        "speedup",
        "speedup_vs_stock",
        "step_cost_greedy_steps",
        "identical_to_stock",
        "backend",
        "greedy_identical",
        "num_prompts",
        "num_new_tokens",
        "environment",
    ):
        assert key in on_disk
    for png in ("accepted_length_hist.png", "per_position_acceptance.png", "per_category.png"):
        assert (tmp_path / "eval" / png).stat().st_size > 1000
    assert "| **all** |" in (tmp_path / "eval" / "report.md").read_text()
    assert "| 0.7 |" in (tmp_path / "eval" / "report.md").read_text()
    # every turn's speculative wall time in parts that add up to it; the report sums them
    turns = [json.loads(line) for line in (tmp_path / "eval" / "turns.jsonl").read_text().splitlines()]
    for t in turns:
        split = t["time_split"]
        assert set(split) == {*PARTS, "outside"} and all(v >= 0 for k, v in split.items() if k != "outside")
        assert sum(split.values()) == pytest.approx(t["spec_time_s"], rel=1e-9)
        assert split["prefill"] > 0 and split["verify"] > 0 and split["draft"] > 0
    assert sum(on_disk["time_split_s"].values()) == pytest.approx(sum(t["spec_time_s"] for t in turns))
    assert "time " in printed.out and "verify " in printed.out and "planner " in printed.out


def test_plots_put_integer_ticks_on_the_draft_position_axis(tmp_path, monkeypatch):
    """Draft positions and accepted lengths are whole numbers: no 1.25, 1.5 ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from draftheads.decode.plots import write_plots

    rep = summarize([turn("a", "all", [1, 3, 2], 1.0, 3.0)], [])
    ticks = []
    close = plt.close

    def record_then_close(fig):
        ticks.append(fig.axes[0].get_xticks().tolist())
        close(fig)

    monkeypatch.setattr(plt, "close", record_then_close)
    write_plots(rep, tmp_path)
    hist, positions = ticks[0], ticks[1]
    assert len(positions) >= 2 and all(float(t).is_integer() for t in positions), positions
    assert len(hist) >= 2 and all(float(t).is_integer() for t in hist), hist


def test_temperatures_that_cannot_sample_are_refused_in_one_line():
    from draftheads.conf.cli import parse

    assert parse(["eval", "heads=x", "eval.temperatures=[]"]).args.eval.temperatures == []
    for bad in ("[0]", "[-0.5]"):
        with pytest.raises(Exception, match="eval.temperatures has .* use temperatures > 0"):
            parse(["eval", "heads=x", f"eval.temperatures={bad}"])
    with pytest.raises(Exception, match=r"eval.temperatures\[0\]=inf is not a finite number"):
        parse(["eval", "heads=x", "eval.temperatures=[inf]"])


def test_per_category_keeps_the_first_prompts_of_every_category():
    from types import SimpleNamespace

    from draftheads.conf.cli import parse
    from draftheads.conf.commands.decode import first_per_category

    rows = [SimpleNamespace(id=i, category=c) for i, c in enumerate("bbaacab")]
    assert [r.id for r in first_per_category(rows, 1)] == [2, 0, 4]
    assert [r.id for r in first_per_category(rows, 2)] == [2, 3, 0, 1, 4]
    assert parse(["eval", "heads=x", "eval.per_category=1"]).args.eval.per_category == 1
    with pytest.raises(Exception, match="eval.per_category=0 is out of range"):
        parse(["eval", "heads=x", "eval.per_category=0"])


def test_drafters_evaluated_together_decode_as_alone_and_share_the_greedy_runs(tiny_llama, monkeypatch):
    """Several drafters in one loop: each gives the turns it gives alone, and stock and
    same-backend greedy (and each baseline) run once per turn for all of them."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.data.prompts import load_prompts
    from draftheads.decode.evaluate import run_eval

    model, tok, fp = tiny_llama
    torch.manual_seed(0)
    drafters = {
        "medusa": MedusaHeads(fp, num_heads=2),
        "eagle3": EagleDrafter(fp, target_config=model.config.to_dict(), version=3, draft_vocab_size=1000),
    }
    for d in drafters.values():
        d.attach(model)
    prompts = load_prompts("heldout", max_prompts=2, tokenizer=tok)
    decode = DecodeConfig(max_new_tokens=10)
    alone = {
        k: run_eval(model, tok, {k: d}, prompts, decode, [], warmup=0, progress=False)[k]
        for k, d in drafters.items()
    }

    calls = []
    stock_generate = model.generate
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1) or stock_generate(*a, **k))
    together = run_eval(model, tok, drafters, prompts, decode, ["pld"], warmup=0, progress=False)

    turns = sum(len(p.turns) for p in prompts)
    assert len(calls) == 3 * turns  # stock, same-backend greedy and prompt lookup, once each
    for k in drafters:
        assert [r.accepted_lengths for r in together[k]] == [r.accepted_lengths for r in alone[k]]
        assert all(r.identical and r.identical_stock for r in together[k])
        assert all(set(r.baselines) == {"pld"} for r in together[k])
    # one greedy run per turn, shared: both drafters are compared with the same reference times
    assert [r.base_time_s for r in together["medusa"]] == [r.base_time_s for r in together["eagle3"]]


def test_an_evaluation_without_drafters_is_refused(tiny_llama):
    from draftheads.conf.errors import UserError
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode.evaluate import run_eval

    model, tok, _ = tiny_llama
    with pytest.raises(UserError, match="at least one drafter"):
        run_eval(model, tok, {}, [], DecodeConfig(), [])
