"""DFlash under ``decode.backend=cuda-graphs``, proven on CPU: the drafting step (block pass over
fixed-capacity context buffers, then DDTree or a static tree) compiles as one graph with no
host read and drafts the eager path's tree; the generator on that path gives the target's
greedy output, and a step reads the device at most twice."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, static
from draftheads.decode.proposers import DFlashProposer, WithLookup
from draftheads.decode.proposers.base import Accepted, Prefill
from draftheads.decode.static import shapes
from draftheads.decode.tree import tree_from_choices
from tests.conftest import get_target
from tests.test_compile import count_step_reads, strict
from tests.test_decode import PROMPTS, OracleGenerator, batch, reference
from tests.test_decode_dflash import dflash

STATIC = "[[0],[1],[0,0],[0,1],[0,0,0]]"


class StrictGraphs(static.Graphs):
    """The graphs hook with every key's ``fn`` compiled by :func:`strict` (one graph, no host
    read) instead of captured; counts the calls per key."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, capture=False)
        self.compiled: dict = {}
        self.calls: Counter = Counter()

    def run(self, key, fn, *inputs):
        if key not in self.compiled:
            self.compiled[key] = strict(fn)
        self.calls[key] += 1
        return self.compiled[key](*inputs)


class RecordingGraphs(static.Graphs):
    """The graphs hook run eagerly (``capture=False``), counting the calls per key."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, capture=False)
        self.calls: Counter = Counter()

    def run(self, key, fn, *inputs):
        self.calls[key] += 1
        return super().run(key, fn, *inputs)


def same_tree(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    assert torch.equal(a.depths, b.depths) and torch.allclose(a.scores, b.scores, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("tree", ["auto", STATIC])
@pytest.mark.parametrize("vocab", [None, 2000], ids=["full-vocab", "draft-vocab"])
@torch.no_grad()
def test_the_dflash_draft_step_compiles_as_one_graph_and_drafts_the_eager_tree(monkeypatch, tree, vocab):
    """Through a left-padded prefill, a step whose rows keep different numbers of positions and
    a row leaving the batch; a small capacity makes the context buffers grow between calls."""
    monkeypatch.setattr(shapes, "MIN_CAPACITY", 16)
    model, tok = get_target("llama")
    d = dflash(draft_vocab_size=vocab)
    st = None if tree == "auto" else tree_from_choices(json.loads(tree))
    cfg = DecodeConfig(tree=tree, top_k_draft=3, total_tokens=9, backend="eager")
    graphs = StrictGraphs(torch.device("cpu"))
    eager, fixed = DFlashProposer(d, st, cfg), DFlashProposer(d, st, cfg, graphs=graphs)

    enc = batch(tok, PROMPTS[1:3])
    valid = enc.attention_mask.bool()
    positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    hidden = model(enc.input_ids, attention_mask=enc.attention_mask, output_hidden_states=True).hidden_states
    root = torch.tensor([11, 12])
    pos = positions[:, -1] + 1
    for p in (eager, fixed):
        p.prefill(Prefill(hidden, enc.input_ids, valid, positions, root))
    same_tree(eager.propose(root, pos), fixed.propose(root, pos))

    torch.manual_seed(1)
    A, n_keep = 9, [5, 2]  # a path wider than rows keep; with the prompt's 8 slots they outgrow 16
    states = tuple(torch.randn(2, 10, h.shape[-1]) for h in hidden)
    step = Accepted(
        states,
        torch.randint(0, 10, (2, A)),
        torch.randint(0, 1000, (2, A)),
        torch.tensor(n_keep),
        n_keep,
        pos,
    )
    pos, root = pos + torch.tensor(n_keep), torch.tensor([13, 14])
    for p in (eager, fixed):
        p.update(step)
    same_tree(eager.propose(root, pos), fixed.propose(root, pos))

    rows = torch.tensor([1])
    for p in (eager, fixed):
        p.select_rows(rows)
    same_tree(eager.propose(root[rows], pos[rows]), fixed.propose(root[rows], pos[rows]))

    assert fixed.valid.sum(1).tolist() == eager.valid.sum(1).tolist() == [int(valid[1].sum()) + n_keep[1]]
    size = 0 if st is None else st.size
    keys = [(k[1], k[2], k[-1]) for k in graphs.calls]  # batch, capacity, static tree size
    assert keys == [(2, 16, size), (2, 32, size), (1, 32, size)]
    assert all(k[0] == "dflash" and k[3] == fixed.cache.lease for k in graphs.calls)


def fixed_drafting(gen: SpeculativeGenerator) -> SpeculativeGenerator:
    """``gen`` drafting DFlash on fixed-capacity buffers through the graphs hook (what
    ``decode.backend=cuda-graphs`` captures), here eagerly, with the static verifier."""
    make = gen.make_proposer
    gen.graphs = RecordingGraphs(gen.device)

    def make_fixed():
        proposer = make()
        inner = getattr(proposer, "inner", proposer)  # the oracle's proposer
        inner = inner.proposer if isinstance(inner, WithLookup) else inner
        inner.graphs = gen.graphs
        return proposer

    gen.make_proposer = make_fixed
    gen.static_verifier = static.StaticVerifier(gen.target, capture=False)
    return gen


@pytest.mark.parametrize(
    "tree,lookup,cost_aware", [("auto", True, True), ("auto", False, False), (STATIC, False, False)]
)
def test_fixed_shape_dflash_drafting_gives_the_targets_greedy_output(monkeypatch, tree, lookup, cost_aware):
    """Oracle drafts make rows keep several positions a step; one row stops at its eos and
    leaves the batch; a small capacity makes the context buffers grow mid-call."""
    monkeypatch.setattr(shapes, "MIN_CAPACITY", 16)
    model, tok = get_target("llama")
    prompts = PROMPTS[:3]
    cont = [reference("llama", p, 30) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    cfg = DecodeConfig(tree=tree, lookup=lookup, cost_aware=cost_aware, top_k_draft=3, total_tokens=10)
    gen = fixed_drafting(OracleGenerator(model, dflash(), tok, cfg, continuations=cont, prompt_lens=plen))
    enc = batch(tok, prompts)
    eos = cont[0][6]
    out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=30, eos_token_id=eos)
    P = enc.input_ids.shape[1]
    assert out[0, P : P + 7].tolist() == cont[0][:7]  # stopped at its eos, and left the batch
    assert [out[i, P:].tolist() for i in (1, 2)] == cont[1:]
    assert cost_aware or gen.last_stats.tau > 1.5  # the planner prunes the oracle's branch on a tiny target
    calls = gen.graphs.calls
    assert {2, 3} <= {k[1] for k in calls} and len({k[2] for k in calls}) >= 2  # rows left; buffers grew
    drafted = sum(calls.values())  # the cost-aware plan verifies some steps without drafting
    assert drafted == gen.last_stats.steps or (cost_aware and drafted > 0)


def test_a_fixed_shape_dflash_step_reads_the_device_at_most_twice(monkeypatch):
    """Every step drafts (no cost-aware plan to skip one); feeding the context into the fixed
    buffers and the drafting call read nothing on the host."""
    model, tok = get_target("llama")
    cfg = DecodeConfig(lookup=False, cost_aware=False)
    gen = fixed_drafting(SpeculativeGenerator(model, dflash(), tok, cfg))
    steps = count_step_reads(monkeypatch, gen, [model, gen.drafter], batch(tok, [PROMPTS[3]]), 16)
    assert len(steps) > 3 and sum(gen.graphs.calls.values()) == len(steps)
    assert all(sum(sites.values()) <= 2 for sites in steps), steps
