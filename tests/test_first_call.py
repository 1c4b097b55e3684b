"""A decoder is fast from its first call: nothing is measured inside a call, and a call's wall
time is accounted for, part by part."""

from __future__ import annotations

import time

import pytest
import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, cost, cost_cache
from draftheads.decode.planner import Planner
from draftheads.decode.stats import PARTS
from tests.test_decode import drafter


def eagle3(model, fp):
    return drafter("eagle", model, fp, version=3)


def test_no_call_measures_at_any_batch_or_context(tiny_llama, tmp_path, monkeypatch, capsys):
    """Building the decoder measures the cost model once, announced; then calls at new batch
    sizes and context lengths read it (a measurement now would raise)."""
    model, tok, fp = tiny_llama
    gen = SpeculativeGenerator(model, eagle3(model, fp), tok, DecodeConfig(cost_cache=str(tmp_path)))
    err = capsys.readouterr().err
    assert err.count("measuring the verify cost of this machine once") == 1 and "done in" in err

    def refuse(*_, **__):
        raise AssertionError("a call measured the verify cost")

    monkeypatch.setattr(cost, "measure_points", refuse)
    monkeypatch.setattr(cost_cache, "measure_model", refuse)
    g = torch.Generator().manual_seed(0)
    for batch, length in ((1, 20), (1, 300), (3, 150), (2, 700)):
        ids = torch.randint(0, 1000, (batch, length), generator=g)
        out = gen.generate(ids, max_new_tokens=6)
        assert out.shape[0] == batch and gen.last_stats.new_tokens >= batch
    # a second decoder on the same set-up reads the cached model: no measurement, nothing said
    SpeculativeGenerator(model, eagle3(model, fp), tok, DecodeConfig(cost_cache=str(tmp_path)))
    assert "measuring" not in capsys.readouterr().err


@pytest.mark.parametrize("lookup", [True, False])
def test_a_calls_parts_add_up_to_its_wall_time_the_callers_included(tiny_llama, lookup):
    model, tok, fp = tiny_llama
    gen = SpeculativeGenerator(model, eagle3(model, fp), tok, DecodeConfig(lookup=lookup))
    ids = tok("a b c a b c a b c", return_tensors="pt").input_ids
    pause, yields = 0.02, 0
    t0 = time.perf_counter()
    for _ in gen.stream(ids, max_new_tokens=12, eos_token_id=[]):
        yields += 1
        time.sleep(pause)  # the caller's own work between two yields
    wall = time.perf_counter() - t0
    s = gen.last_stats
    split = s.split()
    assert set(split) == set(PARTS) and all(v >= 0 for v in split.values())
    assert sum(split.values()) == pytest.approx(s.total_time_s, rel=1e-12)
    assert s.caller_time_s >= pause * yields  # the caller's time is its own part, not the decoder's
    assert s.total_time_s <= wall and s.caller_time_s < pause * yields + 0.5 * (wall - pause * yields)
    for part in ("prefill", "draft", "planner", "verify", "bookkeeping", "setup"):
        assert split[part] > 0, part


def test_a_call_starts_from_what_the_last_call_of_its_decoder_learned(tiny_llama, monkeypatch):
    model, tok, fp = tiny_llama
    gen = SpeculativeGenerator(model, eagle3(model, fp), tok, DecodeConfig())
    ids = tok("a b c a b c a b c", return_tensors="pt").input_ids
    assert gen.last_planner is None
    gen.generate(ids, max_new_tokens=16, eos_token_id=[])
    first = gen.last_planner
    assert first is not None and first.rates  # it learned something: a duel's rates at least
    started = []
    carry = Planner.carry

    def spy(self, last):
        carry(self, last)
        started.append(
            (last, self.scale, self.pass_s, self.trust, {k: dict(v) for k, v in self.rates.items()})
        )

    monkeypatch.setattr(Planner, "carry", spy)
    gen.generate(ids, max_new_tokens=16, eos_token_id=[])
    ((last, scale, pass_s, trust, rates),) = started
    assert last is first and (scale, pass_s, trust) == (first.scale, first.pass_s, first.trust)
    assert rates == first.rates and gen.last_planner is not first


def test_each_acceptance_setting_starts_from_its_own_last_call(tiny_llama, monkeypatch):
    """Greedy acceptance says little about acceptance at temperature 1: a sampling call starts from
    the last call at its own temperature (a fresh planner the first time), never from greedy's,
    and a greedy call after it still starts from the last greedy one."""
    model, tok, fp = tiny_llama
    gen = SpeculativeGenerator(model, eagle3(model, fp), tok, DecodeConfig())
    ids = tok("a b c a b c a b c", return_tensors="pt").input_ids
    carried = []
    carry = Planner.carry
    monkeypatch.setattr(Planner, "carry", lambda self, last: (carried.append(last), carry(self, last)))

    def call(**sampling) -> Planner:
        gen.generate(ids, max_new_tokens=12, eos_token_id=[], **sampling)
        return gen.last_planner

    greedy = call()
    hot = call(do_sample=True, temperature=1.0)
    assert carried == [] and hot is not greedy  # nothing carried into the first call at T 1.0
    warm = call(do_sample=True, temperature=0.7)
    assert carried == []  # nor into the first at T 0.7
    again = call(do_sample=True, temperature=1.0)
    assert carried == [hot] and again is not hot
    assert call() is not greedy and carried == [hot, greedy]  # greedy from greedy
    call(do_sample=True, temperature=0.7, typical=True)  # typical acceptance is its own setting
    assert carried == [hot, greedy] and gen.last_planner is not warm
