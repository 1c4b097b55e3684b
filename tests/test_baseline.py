"""The plain baselines a speed-up is measured against: both loops decode the same greedy text, the
retiring loop samples with the settings ``generate`` resolves, and the faster loop is the one a
ratio uses."""

from __future__ import annotations

import pytest
import torch

from draftheads.decode.baseline import count_new, fastest, retiring_settings, timed_generate, timed_retiring
from tests.test_decode_batched import left_padded, prompts_and_stops


def test_both_plain_loops_decode_the_same_greedy_tokens_and_count_them_alike(tiny_llama):
    model, _, _ = tiny_llama
    prompts, stops = prompts_and_stops(model, model.config.vocab_size)
    ids, mask = left_padded(prompts, pad=0)
    kw = dict(max_new_tokens=10, do_sample=False, eos_token_id=stops, pad_token_id=0)
    ref = timed_generate(model, "eager", None, ids, mask, **kw)
    run = timed_retiring(model, "eager", None, ids, mask, **kw)
    assert run is not None and run.seconds > 0 and ref.seconds > 0
    W = ids.shape[1]
    for a, b in zip(ref.output[:, W:].tolist(), run.output[:, W:].tolist()):
        cut = next((i + 1 for i, t in enumerate(a) if t in stops), len(a))
        assert a[:cut] == b[:cut]
    assert run.new_tokens == ref.new_tokens < len(prompts) * 10  # some rows stopped early


def test_new_tokens_end_at_the_first_stop_or_at_the_padding():
    new = torch.tensor([[5, 7, 2, 2], [5, 0, 0, 0], [5, 6, 7, 8]])
    assert count_new(new, 2, 0) == 3 + 1 + 4
    assert count_new(new, [7, 2], None) == 2 + 4 + 3


def test_the_retiring_loop_samples_what_generate_resolves_and_steps_aside_otherwise(tiny_llama):
    model, _, _ = tiny_llama
    how = retiring_settings(model, dict(do_sample=True, temperature=0.7, max_new_tokens=4), 5)
    # transformers' sampling default top_k=50 holds for both loops
    assert how is not None and (how["temperature"], how["top_k"], how["top_p"]) == (0.7, 50, 1.0)
    assert retiring_settings(model, dict(do_sample=False, max_new_tokens=4), 5)["do_sample"] is False
    # a processor the loop does not apply: generate alone samples the target's distribution
    ids = torch.tensor([[3, 4, 5, 6]])
    kw = dict(max_new_tokens=4, do_sample=True, repetition_penalty=1.3)
    assert timed_retiring(model, "eager", None, ids, torch.ones_like(ids), **kw) is None


@pytest.mark.parametrize(
    ("generate", "retiring", "picked"),
    [(10.0, 12.0, ("retiring", 12.0)), (10.0, 8.0, ("generate", 10.0)), (10.0, None, ("generate", 10.0))],
)
def test_a_ratio_uses_the_faster_plain_loop(generate, retiring, picked):
    assert fastest(generate, retiring) == picked
