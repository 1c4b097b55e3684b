"""The decoder asks the target for the hidden states its drafter reads, and only those.

transformers records the indices ``output_hidden_states`` lists (None at the others); these
tests hold that tuple to the full one on every tiny architecture, and the decoder's output and
the features its drafter is fed to what the full tuple gives, on both verify paths.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, static
from draftheads.heads import fingerprint
from draftheads.heads.masks import additive_mask, padded_causal
from tests.conftest import TINY_KINDS, get_target
from tests.test_decode import PROMPTS, batch, check_rows, drafter
from tests.test_decode_dflash import dflash


def drafters(arch: str) -> dict[str, torch.nn.Module]:
    """Every drafter kind a tiny ``arch`` target takes (EAGLE-3 needs q/k/v projections)."""
    model, tok = get_target(arch)
    fp = fingerprint(model, tok)
    out = {
        "medusa": drafter("medusa", model, fp),
        "eagle1": drafter("eagle", model, fp, version=1),
        "dflash": dflash(arch),
    }
    if arch != "gpt2":
        out["eagle3"] = drafter("eagle", model, fp, version=3, draft_vocab_size=2000)
    return out


def both(model, layers: tuple[int, ...], make_cache=None, **inputs) -> tuple[tuple, tuple]:
    """The hidden states of one forward with ``layers`` requested, and of the same forward with
    all of them (each on a fresh ``make_cache()`` when given)."""
    states = []
    for request in (static.hidden_request(layers), True):
        kw = inputs if make_cache is None else dict(inputs, cache=make_cache(), use_cache=True)
        states.append(model(**kw, output_hidden_states=request).hidden_states)
    return states[0], states[1]


def check_selected(part: tuple, full: tuple, layers: tuple[int, ...]) -> None:
    assert len(part) == len(full)
    for i, (mine, theirs) in enumerate(zip(part, full)):
        if i in layers:
            assert torch.equal(mine, theirs), i
        else:
            assert mine is None, i


@pytest.mark.parametrize("arch", TINY_KINDS)
def test_requested_layers_are_the_full_tuples_entries_and_nothing_else(arch):
    model, tok = get_target(arch)
    L = model.config.num_hidden_layers
    enc = batch(tok, PROMPTS[:3])  # left-padded
    valid = enc.attention_mask.bool()
    prompt = dict(
        input_ids=enc.input_ids,
        attention_mask=additive_mask(padded_causal(valid), model.dtype),
        position_ids=(valid.long().cumsum(-1) - 1).clamp_min(0),
    )
    full = model(**prompt, output_hidden_states=True)
    # index L is the final normed state, the one the lm_head reads
    torch.testing.assert_close(model.get_output_embeddings()(full.hidden_states[L]), full.logits)
    proposers = {
        name: SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=False)).make_proposer()
        for name, d in drafters(arch).items()
    }
    assert proposers["medusa"].hidden_layers == proposers["eagle1"].hidden_layers == (L,)
    assert len(proposers["dflash"].hidden_layers) > 1
    wanted = [(0,), (L,), (1, L - 1), tuple(range(L + 1))] + [p.hidden_layers for p in proposers.values()]
    for layers in wanted:
        check_selected(*both(model, layers, **prompt), layers)
    for name, p in proposers.items():
        part, whole = both(model, p.hidden_layers, **prompt)
        assert torch.equal(p.drafter.select_features(part), p.drafter.select_features(whole)), name

    # a verify-shaped forward: three tree nodes after the cached prompt, a 4-D tree mask
    def filled() -> DynamicCache:
        cache = DynamicCache()
        model(**prompt, cache=cache, use_cache=True)
        return cache

    B, P = enc.input_ids.shape
    anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    step = dict(
        input_ids=enc.input_ids[:, -3:],
        attention_mask=additive_mask(
            torch.cat([valid[:, None].expand(B, 3, P), anc.expand(B, 3, 3)], -1), model.dtype
        ),
        position_ids=valid.sum(-1, keepdim=True) + torch.tensor([[0, 1, 1]]),
        make_cache=filled,
    )
    for layers in [p.hidden_layers for p in proposers.values()] + [(0, L)]:
        check_selected(*both(model, layers, **step), layers)


class Recorder:
    """Wraps a proposer: records which hidden states each prefill/update receives and the features
    its drafter reads from them; ``layers`` overrides what it asks the target for."""

    def __init__(self, inner, drafter_, layers: tuple[int, ...] | None = None) -> None:
        self.inner, self.drafter = inner, drafter_
        self.hidden_layers = inner.hidden_layers if layers is None else layers
        self.present: list[tuple[int, ...]] = []
        self.features: list[torch.Tensor] = []

    def _record(self, states) -> None:
        self.present.append(tuple(i for i, h in enumerate(states) if h is not None))
        self.features.append(self.drafter.select_features(states))

    def prefill(self, batch_) -> None:
        self._record(batch_.hidden_states)
        self.inner.prefill(batch_)

    def update(self, step) -> None:
        self._record(step.hidden_states)
        self.inner.update(step)

    def propose(self, root, pos, plan=None):
        return self.inner.propose(root, pos, plan)

    def select_rows(self, rows) -> None:
        self.inner.select_rows(rows)

    @property
    def passes(self) -> int:
        return getattr(self.inner, "passes", 0)


class RecordingGenerator(SpeculativeGenerator):
    def __init__(self, *a, layers: tuple[int, ...] | None = None, **kw) -> None:
        super().__init__(*a, **kw)
        self.layers, self.recorders = layers, []

    def make_proposer(self):
        self.recorders.append(Recorder(super().make_proposer(), self.drafter, self.layers))
        return self.recorders[-1]


@pytest.mark.parametrize("arch", TINY_KINDS)
@pytest.mark.parametrize("verify", ["dynamic", "static"])
def test_decoder_feeds_the_drafter_the_full_tuples_features(arch, verify):
    """Per step, the drafter's features with only its layers requested equal those with every
    layer requested, and the output is the target's greedy output, on both verify paths."""
    model, tok = get_target(arch)
    L = model.config.num_hidden_layers
    fp = fingerprint(model, tok)
    if arch == "gpt2":  # EAGLE-3 needs q/k/v projections: EAGLE-1 reads the last state alone
        cases = {"eagle1": drafter("eagle", model, fp, version=1)}
    else:
        cases = {"eagle3": drafter("eagle", model, fp, version=3, draft_vocab_size=2000)}
    if arch in ("gpt2", "llama"):
        cases["dflash"] = dflash(arch)
    prompts = PROMPTS[:3]
    for kind, d in cases.items():
        runs = {}
        for layers in (None, tuple(range(L + 1))):
            gen = RecordingGenerator(model, d, tok, DecodeConfig(cost_aware=False), layers=layers)
            if verify == "static":
                gen.static_verifier = static.StaticVerifier(model, capture=False)
            check_rows(arch, gen, prompts, new=12)
            (rec,) = gen.recorders
            runs[layers is None] = rec
        mine, every = runs[True], runs[False]
        assert set(mine.present) == {tuple(sorted(mine.hidden_layers))}, kind
        assert set(every.present) == {tuple(range(L + 1))}, kind
        assert len(mine.features) == len(every.features) > 2
        for a, b in zip(mine.features, every.features):
            assert torch.equal(a, b), kind
