"""The planner's floor: with a drafter that does not pay, decoding falls back to the better of
plain and lookup-only steps, at batch 1, 4 and 8, on short and long prompts.

The drafter here is random (its drafts are almost never accepted) and each of its passes is made
to cost five target steps on a synthetic clock, so the test checks the planner's decisions, not
timings: the decoder reads every part's time from the clock below, and a verify forward costs
the same whatever it verifies (so lookup branches are free and worth verifying).
"""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.cost import CostCurve
from draftheads.decode.stats import DecodeStats
from tests.test_decode import drafter

PASS_S, VERIFY_S = 5.0, 1.0  # a drafter pass costs five verify forwards


def synthetic_clock(monkeypatch, d) -> None:
    """Every part of a call takes its time from a synthetic clock: a drafter pass ``PASS_S``, a
    verify forward ``VERIFY_S``, everything else nothing."""
    passes = [0]
    d.register_forward_hook(lambda *_: passes.__setitem__(0, passes[0] + 1))
    real = DecodeStats.lap

    def lap(self, part: str, now: float) -> float:
        real(self, part, now)  # keeps the real clock's bookkeeping; the planner reads the return
        elapsed = {"draft": PASS_S * passes[0], "verify": VERIFY_S}.get(part, 0.0)
        passes[0] = 0 if part == "draft" else passes[0]
        return elapsed

    monkeypatch.setattr(DecodeStats, "lap", lap)
    flat = lambda self, batch=1, context=1: CostCurve([batch, 64 * batch], [VERIFY_S, VERIFY_S])  # noqa: E731
    monkeypatch.setattr(SpeculativeGenerator, "cost_curve", flat)


def prompts(tok, batch: int, long: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` left-padded prompts; long ones repeat a passage the answer may copy from."""
    base = "one two three four five six seven eight nine ten " * (40 if long else 1)
    texts = [f"{i} {base}" for i in range(batch)]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("long", [False, True])
def test_a_drafter_that_does_not_pay_is_left_out_for_lookup_or_plain_steps(
    tiny_llama, monkeypatch, batch, long
):
    model, tok, fp = tiny_llama
    d = drafter("eagle", model, fp, version=3)
    synthetic_clock(monkeypatch, d)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=True))
    ids, mask = prompts(tok, batch, long)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=64, eos_token_id=[])
    s = gen.last_stats
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=None)
    assert torch.equal(out, ref[:, : out.shape[1]])  # greedy output all the same
    drafted = s.steps - s.undrafted_steps
    assert s.steps >= 20 and drafted <= 0.2 * s.steps  # the drafter only probed now and then
    assert drafted >= 2  # but it is probed again: a drafter that starts paying is noticed
    assert max(s.tree_tokens) > 1  # the steps without it still verify lookup branches


def test_without_lookup_the_floor_is_plain_decoding(tiny_llama, monkeypatch):
    model, tok, fp = tiny_llama
    d = drafter("eagle", model, fp, version=3)
    synthetic_clock(monkeypatch, d)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=False))
    ids, mask = prompts(tok, 4, False)
    gen.generate(ids, attention_mask=mask, max_new_tokens=64, eos_token_id=[])
    s = gen.last_stats
    assert s.steps >= 40 and s.steps - s.undrafted_steps <= 0.2 * s.steps
    assert s.tree_tokens.count(1) >= 0.8 * s.steps  # plain steps: the root alone


def test_a_drafter_that_pays_keeps_drafting_against_lookup(tiny_llama, monkeypatch):
    """The other side of the duel: when drafting is cheap, the drafter's steps are not given up
    for lookup-only ones (the random drafter's drafts are rare, but a pass costs nothing here)."""
    model, tok, fp = tiny_llama
    d = drafter("eagle", model, fp, version=3)
    synthetic_clock(monkeypatch, d)
    monkeypatch.setattr("tests.test_planner_floor.PASS_S", 0.0)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=False))
    ids, mask = prompts(tok, 1, False)
    gen.generate(ids, attention_mask=mask, max_new_tokens=48, eos_token_id=[])
    s = gen.last_stats
    assert s.undrafted_steps <= 0.5 * s.steps
