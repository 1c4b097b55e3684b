"""The planner's floor: with a drafter that does not pay, decoding falls back to the better of
plain and lookup-only steps, at batch 1, 4 and 8, on short and long prompts, greedy and sampling
(where a drafter whose drafts the target never samples is left out on measured acceptance alone,
and the output keeps the target's exact distribution).

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
from draftheads.decode.proposers.combined import WithLookup
from draftheads.decode.stats import DecodeStats
from draftheads.decode.tree import Tree
from tests.test_decode import drafter
from tests.test_decode_sampling import assert_trigram_frequencies

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


# ---- under sampling: a drafter whose drafts the target never takes ------------------------------
SUPPRESSED = 5  # a token every sampling call here suppresses: the target gives it no probability


class NeverTaken:
    """A real proposer whose every drafted token is :data:`SUPPRESSED`: at any temperature the
    target samples it with probability 0, so no draft is ever accepted (the drafter still runs,
    and its passes still cost)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.hidden_layers = inner.hidden_layers

    @property
    def passes(self) -> int:
        return getattr(self.inner, "passes", 0)

    def prefill(self, batch) -> None:
        self.inner.prefill(batch)

    def propose(self, root, pos, plan=None) -> Tree:
        tree = self.inner.propose(root, pos, plan)
        tokens = tree.tokens.clone()
        tokens[:, 1:] = SUPPRESSED
        return Tree(tokens, tree.parents, tree.depths, tree.scores, tree.valid)

    def update(self, step) -> None:
        self.inner.update(step)

    def select_rows(self, rows) -> None:
        self.inner.select_rows(rows)


class NeverTakenGenerator(SpeculativeGenerator):
    """The decoder with :class:`NeverTaken` drafts (lookup branches, when on, left as they are)."""

    def make_proposer(self):
        proposer = super().make_proposer()
        if isinstance(proposer, WithLookup):
            proposer.proposer = NeverTaken(proposer.proposer)
            return proposer
        return NeverTaken(proposer)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("batch", [1, 4])
def test_under_sampling_a_drafter_that_is_never_taken_gives_way_to_plain_steps(
    tiny_llama, monkeypatch, batch, temperature
):
    """Drafting is cheap here (a pass a fifth of a verify forward, verifying more nodes free), so
    drafting stops paying for one reason only: at this temperature nothing drafted is accepted.
    The planner measures that and falls back to plain sampling steps, probing the drafter now
    and then."""
    model, tok, fp = tiny_llama
    d = drafter("eagle", model, fp, version=3)
    synthetic_clock(monkeypatch, d)
    monkeypatch.setattr("tests.test_planner_floor.PASS_S", 0.2)
    gen = NeverTakenGenerator(model, d, tok, DecodeConfig(lookup=False))
    ids, mask = prompts(tok, batch, False)
    kw = dict(do_sample=True, temperature=temperature, suppress_tokens=[SUPPRESSED], eos_token_id=[])
    torch.manual_seed(0)  # the samples, and so the steps the planner sees, are the same every run
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=64, **kw)
    s = gen.last_stats
    assert SUPPRESSED not in out[:, ids.shape[1] :].tolist()
    assert s.tau == 1.0  # no draft was ever taken
    drafted = s.steps - s.undrafted_steps
    assert s.steps >= 60 and drafted <= 0.2 * s.steps  # plain sampling steps, mostly
    assert drafted >= 2  # the drafter is still probed: one that starts paying is noticed
    assert s.tree_tokens.count(1) >= 0.8 * s.steps  # plain steps verify the root alone
    assert drafted == 1 + sum(1 for n in s.tree_tokens[1:] if n > 1)  # each probe verified a draft


def test_under_sampling_with_lookup_the_floor_is_lookup_or_plain_steps(tiny_llama, monkeypatch):
    """With lookup branches on, the steps without the never-taken drafter still verify the
    branches where the text repeats the prompt."""
    model, tok, fp = tiny_llama
    d = drafter("eagle", model, fp, version=3)
    synthetic_clock(monkeypatch, d)
    monkeypatch.setattr("tests.test_planner_floor.PASS_S", 0.2)
    gen = NeverTakenGenerator(model, d, tok, DecodeConfig(lookup=True))
    ids, mask = prompts(tok, 4, True)
    kw = dict(do_sample=True, temperature=0.7, suppress_tokens=[SUPPRESSED], eos_token_id=[])
    torch.manual_seed(0)
    gen.generate(ids, attention_mask=mask, max_new_tokens=64, **kw)
    s = gen.last_stats
    drafted = s.steps - s.undrafted_steps
    assert s.steps >= 20 and drafted <= 0.2 * s.steps and drafted >= 2


def test_the_fallback_under_sampling_keeps_the_exact_distribution(monkeypatch):
    """The joint distribution of the first three new tokens over 4000 rows (one batch) while the
    planner drops a never-taken drafter for a plain sampling step (the first step drafts, the
    second is plain, the third probes the drafter again), against the exact product of the
    target's warped conditionals."""
    from draftheads.decode.verify import warp
    from draftheads.heads import fingerprint
    from tests.test_decode_sampling import SMALL, small_vocab_target

    model = small_vocab_target()
    V, N = 6, 4000
    d = drafter("eagle", model, fingerprint(model, None), **SMALL["eagle"])
    synthetic_clock(monkeypatch, d)
    monkeypatch.setattr("tests.test_planner_floor.PASS_S", 0.2)
    warp_kw = dict(temperature=0.9, top_k=4, top_p=0.95)
    prompt = torch.tensor([[0, 3, 1, 4, 0, 3]])
    grid = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    with torch.no_grad():
        lg = model(torch.cat([prompt.expand(V * V, -1), grid], 1)).logits
    lg[..., SUPPRESSED] = float("-inf")  # as suppress_tokens leaves it
    P = prompt.shape[1]
    p1, p2, p3 = warp(lg[0, P - 1], **warp_kw), warp(lg[:, P], **warp_kw), warp(lg[:, P + 1], **warp_kw)
    exact = p1[:, None, None] * p2[torch.arange(V) * V][:, :, None] * p3.reshape(V, V, V)
    cfg = DecodeConfig(top_k_draft=3, depth=3, total_tokens=6, lookup=False)
    gen = NeverTakenGenerator(model, d, None, cfg)
    torch.manual_seed(5)
    out = gen.generate(
        prompt.expand(N, -1), max_new_tokens=4, do_sample=True, suppress_tokens=[SUPPRESSED], **warp_kw
    )
    assert_trigram_frequencies(out[:, P : P + 3], exact)
    s = gen.last_stats
    assert s.steps == 3 and s.undrafted_steps == 1 and s.tree_tokens[1] == 1 < s.tree_tokens[0]
