"""The distillation loop: greedy rows equal ``generate``'s, finished rows leave the batch."""

from __future__ import annotations

import pytest
import torch

from draftheads.decode import batched
from draftheads.decode.batched import generate_retiring
from draftheads.decode.static import StaticLayer


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def until_stop(row: list[int], stops: set[int]) -> list[int]:
    cut = next((j for j, t in enumerate(row) if t in stops), None)
    return row if cut is None else row[: cut + 1]


def prompts_and_stops(model, vocab: int, n: int = 6) -> tuple[list[list[int]], list[int]]:
    """Random prompts of different lengths, and stop ids that some rows reach early and others
    not at all (tokens of the first rows' own greedy continuations)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (4 + 3 * i,), generator=g).tolist() for i in range(n)]
    stops = []
    for p, at in zip(prompts[:2], (2, 7)):
        free = model.generate(torch.tensor([p]), max_new_tokens=at + 1, do_sample=False, pad_token_id=0)
        stops.append(int(free[0, len(p) + at]))
    return prompts, stops


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_greedy_rows_equal_generate_and_finished_rows_are_dropped(kind, monkeypatch):
    from tests.conftest import get_target

    model, _ = get_target(kind)
    vocab = model.config.vocab_size
    prompts, stops = prompts_and_stops(model, vocab)
    ids, mask = left_padded(prompts, pad=0)
    kept = []
    real_set = StaticLayer._set

    def spy(layer, name, t):  # record the batch size of every compaction, then do it
        if layer.index == 0 and name == "k_buf" and layer.k_buf is not None and len(t) < len(layer.k_buf):
            kept.append(len(t))
        return real_set(layer, name, t)

    monkeypatch.setattr(StaticLayer, "_set", spy)
    out = generate_retiring(model, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=stops)
    ref = model.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=stops, pad_token_id=0
    )
    mine = [until_stop(r, set(stops)) for r in out[:, ids.shape[1] :].tolist()]
    theirs = [until_stop(r, set(stops)) for r in ref[:, ids.shape[1] :].tolist()]
    assert mine == theirs
    ended = [r for r in mine if r[-1] in stops]
    assert 0 < len(ended) < len(mine)  # some rows stopped early, others ran to the end
    assert kept and kept[0] < len(prompts)  # and the stopped rows left the batch


def test_every_row_ended_stops_the_loop_early(tiny_llama):
    model, _, _ = tiny_llama
    prompts, stops = prompts_and_stops(model, model.config.vocab_size, n=2)
    ids, mask = left_padded(prompts, pad=0)
    out = generate_retiring(model, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=stops)
    # row 1 stops after 8 tokens at the latest (its own stop id), row 0 after 3
    assert out.shape[1] <= ids.shape[1] + 8
    assert all(any(t in stops for t in r) for r in out[:, ids.shape[1] :].tolist())


def test_sampling_is_reproducible_and_a_vanishing_top_p_is_greedy(tiny_llama):
    model, _, _ = tiny_llama
    prompts, _ = prompts_and_stops(model, model.config.vocab_size, n=3)
    ids, mask = left_padded(prompts, pad=0)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=True, temperature=1.3, top_p=0.9)
    draws = []
    for _ in range(2):
        torch.manual_seed(5)
        draws.append(generate_retiring(model, ids, **kw))
    assert torch.equal(draws[0], draws[1])
    torch.manual_seed(6)
    assert not torch.equal(generate_retiring(model, ids, **kw), draws[0])
    nucleus = generate_retiring(model, ids, **{**kw, "top_p": 1e-9})
    greedy = generate_retiring(model, ids, attention_mask=mask, max_new_tokens=8)
    assert torch.equal(nucleus, greedy)


def test_next_tokens_samples_only_inside_the_nucleus():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]]).repeat(2000, 1)
    torch.manual_seed(0)
    drawn = batched.next_tokens(logits, True, 1.0, 0.9)
    probs = logits[0].softmax(-1)
    # the nucleus of mass >= 0.9 is {0, 1}; inside it the draw follows p renormalised
    assert set(drawn.tolist()) == {0, 1}
    share = (drawn == 0).float().mean().item()
    assert abs(share - (probs[0] / probs[:2].sum()).item()) < 0.04


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_shared_prompt_prefix_runs_once_and_changes_no_token(kind, monkeypatch):
    from tests.conftest import get_target

    model, _ = get_target(kind)
    g = torch.Generator().manual_seed(1)
    head = torch.randint(3, model.config.vocab_size, (10,), generator=g).tolist()
    prompts, stops = prompts_and_stops(model, model.config.vocab_size, n=4)
    prompts = [head + p for p in prompts]  # every prompt starts with the same 10 tokens
    ids, mask = left_padded(prompts, pad=0)
    assert batched.shared_prefix(ids, mask) == 10
    widths = []
    real_forward = model.forward

    def spy(*args, **kwargs):  # record the shape of every forward's input
        widths.append(tuple(kwargs["input_ids"].shape))
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    out = generate_retiring(model, ids, attention_mask=mask, max_new_tokens=10, eos_token_id=stops)
    monkeypatch.undo()
    # the prefix alone for one row, then the rest of every row
    assert widths[:2] == [(1, 10), (len(prompts), ids.shape[1] - 10)]
    ref = model.generate(
        ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=stops, pad_token_id=0
    )
    mine = [until_stop(r, set(stops)) for r in out[:, ids.shape[1] :].tolist()]
    assert mine == [until_stop(r, set(stops)) for r in ref[:, ids.shape[1] :].tolist()]


def test_the_shared_prefix_leaves_every_row_a_token_and_needs_left_padding():
    ids = torch.tensor([[0, 5, 6, 7], [5, 6, 7, 8], [0, 0, 5, 6]])
    mask = (ids != 0).long()
    assert batched.shared_prefix(ids, mask) == 1  # the shortest row keeps its last token
    assert batched.shared_prefix(ids[:2], mask[:2]) == 2
    assert batched.shared_prefix(ids[:1], mask[:1]) == 0  # one row shares nothing
    right = torch.tensor([[5, 6, 0], [5, 6, 7]])
    assert batched.shared_prefix(right, (right != 0).long()) == 0  # not left padding
