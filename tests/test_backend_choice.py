"""``decode.backend=auto`` by measurement: the fastest candidate wins, timings are cached per
device, thread count, dtype and shapes, and an asked backend that is slower is used and named."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, backend_choice
from draftheads.decode import backend as backends
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import PROMPTS, check_rows, drafter

pytestmark = pytest.mark.skipif(not backends.onednn_available(), reason="this torch has no oneDNN")

SLEEP_S = 0.001  # per linear call: a step makes dozens, far above a tiny model's whole step


def slow_onednn(monkeypatch) -> None:
    """Every packed linear call sleeps first: oneDNN is the slow backend."""
    call = backends._Dispatch.__call__

    def sleepy(self, x):
        if (backends._ACTIVE.get() or {}).get(self.m) is not None:
            time.sleep(SLEEP_S)
        return call(self, x)

    monkeypatch.setattr(backends._Dispatch, "__call__", sleepy)


def slow_eager(monkeypatch) -> None:
    """Every stock linear call sleeps first: eager is the slow backend (packed calls do not use it)."""
    forward = nn.Linear.forward

    def sleepy(self, x):
        time.sleep(SLEEP_S)
        return forward(self, x)

    monkeypatch.setattr(nn.Linear, "forward", sleepy)


@pytest.mark.parametrize("slow,fast", [(slow_onednn, "eager"), (slow_eager, "onednn")])
def test_auto_picks_the_backend_measured_faster_for_target_and_drafter(tmp_path, monkeypatch, slow, fast):
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=3, draft_vocab_size=2000)
    slow(monkeypatch)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(cost_cache=str(tmp_path)))
    assert gen.backend == fast and gen.drafter_backend == fast
    parts = {c.part: c for c in gen.choices}
    assert set(parts) == {"target", "drafter"}
    for c in parts.values():
        assert c.name == fast and not c.asked and c.seconds[c.name] < c.seconds[c.fastest] * 1.0001
    lines = gen.backend_lines()
    assert len(lines) == 2 and all(f": {fast} (auto" in line for line in lines)
    monkeypatch.undo()
    check_rows("llama", gen, PROMPTS[:2])  # the chosen backend still gives greedy output


def test_an_asked_backend_that_is_slower_is_used_with_one_line_saying_by_how_much(tmp_path, monkeypatch):
    model, tok = get_target("llama")
    slow_onednn(monkeypatch)
    SpeculativeGenerator(model, None, tok, DecodeConfig(cost_cache=str(tmp_path)))  # auto: times, caches
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(backend="onednn", cost_cache=str(tmp_path)))
    assert gen.backend == "onednn"
    (line,) = gen.backend_lines()
    assert "decode.backend=onednn is" in line and "x slower than eager" in line and "used as asked" in line
    ratio = float(line.split(" is ")[1].split("x")[0])
    assert ratio > 1.03


def test_an_asked_backend_times_nothing(tmp_path, monkeypatch):
    model, tok = get_target("llama")
    timed: list[str] = []
    monkeypatch.setattr(
        backend_choice, "time_target", lambda target, name, cache=None: timed.append(name) or 1.0
    )
    monkeypatch.setattr(
        backend_choice, "time_layers", lambda layers, name, cache=None: timed.append(name) or 1.0
    )
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(backend="eager", cost_cache=str(tmp_path)))
    assert gen.backend_lines() == ["backend for the target: eager (as asked; not timed)"] and timed == []


def test_a_cached_choice_is_reused_only_for_the_same_device_threads_dtype_and_shapes(tmp_path):
    model, _ = get_target("llama")
    calls: list[str] = []

    def timer(name: str) -> float:
        calls.append(name)
        return {"eager": 2.0, "onednn": 1.0}[name]

    shapes = backend_choice.target_shapes(model)
    key = backend_choice.choice_key("target", torch.device("cpu"), torch.float32, shapes)
    first = backend_choice.choose("target", "auto", ("eager", "onednn"), key, timer, tmp_path)
    assert (first.name, first.cached, calls) == ("onednn", False, ["eager", "onednn"])
    again = backend_choice.choose("target", "auto", ("eager", "onednn"), key, timer, tmp_path)
    assert (again.name, again.cached, len(calls)) == ("onednn", True, 2)  # read back, not timed
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        other = backend_choice.choice_key("target", torch.device("cpu"), torch.float32, shapes)
    finally:
        torch.set_num_threads(threads)
    assert not backend_choice.choose("target", "auto", ("eager", "onednn"), other, timer, tmp_path).cached
    assert len(calls) == 4
    # a file at this key's name written for another device is measured again, never reused
    (f,) = [p for p in tmp_path.iterdir() if f"-t{threads}-" in p.name]
    data = json.loads(f.read_text())
    data["key"]["device"] = "cpu:another CPU"
    data["seconds"] = {"eager": 0.5, "onednn": 9.0}
    f.write_text(json.dumps(data))
    fresh = backend_choice.choose("target", "auto", ("eager", "onednn"), key, timer, tmp_path)
    assert (fresh.name, fresh.cached, len(calls)) == ("onednn", False, 6)


def test_nothing_is_timed_where_one_backend_applies(tmp_path):
    model, tok = get_target("llama")
    assert backend_choice.candidates(torch.device("cpu"), torch.bfloat16) == ()
    assert backend_choice.candidates(torch.device("cuda"), torch.float32) == ()
    assert backend_choice.choose_target("cuda-graphs", model, tmp_path) is None
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(cost_cache=str(tmp_path)))
    assert [c.part for c in gen.choices] == ["target"]  # lookup alone: no drafter layers to time


@pytest.mark.parametrize(
    "edit,why",
    [
        (lambda d: d["seconds"].update(onednn=float("inf")), "finite positive seconds"),
        (lambda d: d["seconds"].update(onednn=float("nan")), "finite positive seconds"),
        (lambda d: d["seconds"].update(eager=-1.0), "finite positive seconds"),
        (lambda d: d["seconds"].pop("eager"), "does not time every one of eager, onednn"),
        (lambda d: d["key"].update(threads=999), "measured for another set-up (threads 999"),
    ],
)
def test_an_unusable_cached_choice_is_said_in_one_line_and_timed_again(tmp_path, capsys, edit, why):
    """The backend timings read through the cost cache's validation: an edit that makes a timing
    unusable is never used ('onednn inf ms; cached'), and is said once."""
    model, _ = get_target("llama")
    key = backend_choice.choice_key(
        "target", torch.device("cpu"), torch.float32, backend_choice.target_shapes(model)
    )
    timer = {"eager": 2.0, "onednn": 1.0}.get
    backend_choice.choose("target", "auto", ("eager", "onednn"), key, timer, tmp_path)
    (f,) = tmp_path.iterdir()
    data = json.loads(f.read_text())
    edit(data)
    f.write_text(json.dumps(data))
    capsys.readouterr()
    again = backend_choice.choose("target", "auto", ("eager", "onednn"), key, timer, tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0] and "measuring it again" in err[0] and str(f) in err[0]
    assert not again.cached and again.seconds == {"eager": 2.0, "onednn": 1.0}
    assert backend_choice.choose(
        "target", "auto", ("eager", "onednn"), key, timer, tmp_path
    ).cached  # rewritten
