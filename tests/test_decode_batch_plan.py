"""Every path the cost-aware planner can take in a batch keeps the output lossless: greedy output
token-identical at batch 4 and the exact sampling distribution over many rows; and at batch 4 the
planner falls back to plain steps when drafting cannot pay, re-probing later."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.cost import CostCurve
from draftheads.decode.planner import MAX_WAIT, Planner
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import PROMPTS, check_rows, coarse_curves, drafter
from tests.test_decode_sampling import SMALL, assert_trigram_frequencies, small_vocab_target

ROWS = [*PROMPTS[:3], "a b c d a b c d a b c d a b c"]  # the last one gives lookup something


def steep(batch: int) -> CostCurve:
    """A batch's curve on which one more node per row costs 5 plain steps: drafting never pays."""
    return CostCurve([batch, 2 * batch, 64 * batch], [1.0, 6.0, 400.0])


def force(path: str, monkeypatch) -> bool:
    """Make the planner take ``path``; returns whether lookup branches should be on. The forced
    paths fix the planner's choice too: its own choice reads timings, which a loaded machine
    changes (the planner's choice itself is the ``fallback`` path's)."""

    def every(self, scores, valid=None, drafted=True) -> int:  # verify every node drafted
        return scores.shape[-1]

    if path == "drafted":  # the drafter every step, all its nodes verified
        monkeypatch.setattr(Planner, "drafting", lambda self, level=0: True)
        monkeypatch.setattr(Planner, "choose", every)
    elif path == "root-only":  # drafted, but no node pays: the root alone is verified
        monkeypatch.setattr(Planner, "drafting", lambda self, level=0: True)
        monkeypatch.setattr(Planner, "choose", lambda self, scores, valid=None, drafted=True: 0)
    elif path == "lookup-only":  # the drafter skipped: lookup branches alone, all verified
        monkeypatch.setattr(Planner, "drafting", lambda self, level=0: False)
        monkeypatch.setattr(Planner, "choose", every)
    elif path == "plain":  # the drafter skipped and no lookup: a plain step
        monkeypatch.setattr(Planner, "drafting", lambda self, level=0: False)
    elif path == "fallback":  # the planner's own choice on a curve where drafting cannot pay
        monkeypatch.setattr(SpeculativeGenerator, "cost_curve", lambda self, batch=1, context=1: steep(batch))
    return path != "plain"


def check_path(path: str, stats) -> None:
    """The call really took ``path`` (what its stats show)."""
    plain = [n == 1 for n in stats.tree_tokens]
    if path == "drafted":
        assert stats.undrafted_steps == 0 and not all(plain)
    elif path == "root-only":
        assert stats.undrafted_steps == 0 and all(plain)
    elif path == "lookup-only":
        assert stats.undrafted_steps == stats.steps and not all(plain)
    elif path == "plain":
        assert stats.undrafted_steps == stats.steps and all(plain)
    elif path == "fallback":
        assert stats.undrafted_steps > 0 and stats.undrafted_steps < stats.steps  # skips, then probes


PATHS = ["drafted", "root-only", "lookup-only", "plain", "fallback"]


@pytest.mark.parametrize("path", PATHS)
def test_every_planner_path_keeps_greedy_output_at_batch_4(path, monkeypatch):
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=force(path, monkeypatch)))
    check_rows("llama", gen, ROWS)
    assert gen.last_stats.steps > 0
    check_path(path, gen.last_stats)


def test_at_batch_4_the_planner_falls_back_to_plain_steps_when_drafting_cannot_pay_and_reprobes():
    p = Planner(steep(4), batch=4)
    confident = torch.full((4, 2), 0.9)
    drafted = []
    for step in range(300):  # every draft accepted as scored: still not worth 5 plain steps a node
        n = 0
        if p.drafting():
            p.draft_s = 0.01
            n = p.choose(confident)
            drafted.append((step, n))
        p.observe(0.01 if drafted and drafted[-1][0] == step else 0.0, 1, p.curve(4 * (n + 1)), 4 * (n + 1))
        p.calibrate(4 * 0.9 * n, 4 * 0.9 * n)
    assert drafted[0] == (0, 0)  # the first drafted step already verifies the roots alone
    steps = [s for s, _ in drafted]
    assert len(drafted) < 30  # mostly plain steps
    assert max(b - a for a, b in zip([-1, *steps], steps)) <= MAX_WAIT + 1  # probes never stop
    assert all(n >= 1 for _, n in drafted[1:])  # and every probe verifies something

    cheap = Planner(CostCurve([4, 8, 256], [1.0, 1.05, 8.0]), batch=4)  # a batch where nodes are cheap
    assert cheap.best(confident)[0] == 2  # the same drafts pay there


@pytest.mark.parametrize("path", PATHS)
def test_sampling_keeps_the_exact_distribution_on_every_planner_path(path, monkeypatch):
    """The joint distribution of the first three new tokens over 4000 rows (one batch), on each
    path the planner can take, against the exact product of the target's warped conditionals."""
    from draftheads.decode.verify import warp

    coarse_curves(monkeypatch)  # the forced paths below replace it where they set the curve
    model = small_vocab_target()
    V, N = 6, 4000
    d = drafter("eagle", model, fingerprint(model, None), **SMALL["eagle"])
    warp_kw = dict(temperature=0.9, top_k=4, top_p=0.95)
    prompt = torch.tensor([[0, 3, 1, 4, 0, 3]])
    grid = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    with torch.no_grad():
        lg = model(torch.cat([prompt.expand(V * V, -1), grid], 1)).logits
    P = prompt.shape[1]
    p1, p2, p3 = warp(lg[0, P - 1], **warp_kw), warp(lg[:, P], **warp_kw), warp(lg[:, P + 1], **warp_kw)
    exact = p1[:, None, None] * p2[torch.arange(V) * V][:, :, None] * p3.reshape(V, V, V)
    lookup = force(path, monkeypatch)
    cfg = DecodeConfig(top_k_draft=3, depth=3, total_tokens=6, lookup=lookup, lookup_tokens=3)
    gen = SpeculativeGenerator(model, d, None, cfg)
    torch.manual_seed(5)
    out = gen.generate(prompt.expand(N, -1), max_new_tokens=3, do_sample=True, **warp_kw)
    assert_trigram_frequencies(out[:, P : P + 3], exact)
    check_path(path, gen.last_stats)
