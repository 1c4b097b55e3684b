"""The parts that make a step cheap: backends, the cost curve and planner, tree pruning,
lookup branches; and that none of them changes the output."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode import backend as backends
from draftheads.decode.context import cap_depth
from draftheads.decode.cost import CostCurve, CostModel, model_key
from draftheads.decode.cost_cache import cached_model
from draftheads.decode.planner import Planner, next_depth
from draftheads.decode.proposers import Accepted, LookupProposer, Prefill, Tree, combined
from draftheads.decode.proposers.lookup import NgramIndex
from draftheads.decode.select import add_chains, drop_padding, from_rows, monotone, prune
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import PROMPTS, Oracle, check_rows, drafter, reference
from tests.test_decode_dflash import dflash

REPEATS = [
    "a b c d e f a b c d e f a b c",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return x +",
    "one two three, one two three, one two",
]


def tree_of(rows) -> Tree:
    return from_rows(rows, torch.device("cpu"))


# ---- pure tree surgery -----------------------------------------------------------------------------
def test_prune_keeps_the_best_nodes_closed_under_ancestors():
    # root; a (0.9) -> b (0.5) -> c (0.1); d (0.6) under the root
    t = tree_of([([7, 1, 2, 3, 4], [0, 0, 1, 2, 0], [0, 1, 2, 3, 1], [1.0, 0.9, 0.5, 0.1, 0.6])])
    p = prune(t, 2)
    assert p.tokens.tolist() == [[7, 1, 4]] and p.parents.tolist() == [[0, 0, 0]]
    p = prune(t, 3)
    assert p.tokens.tolist() == [[7, 1, 2, 4]] and p.parents.tolist() == [[0, 0, 1, 0]]
    assert p.depths.tolist() == [[0, 1, 2, 1]]
    assert prune(t, 0).tokens.tolist() == [[7]]
    assert prune(t, 10) is t


def test_prune_of_a_padded_batch_keeps_padding_invalid():
    t = tree_of([([5, 1, 2], [0, 0, 1], [0, 1, 2], [1.0, 0.8, 0.7]), ([6], [0], [0], [1.0])])
    assert t.valid.tolist() == [[True, True, True], [True, False, False]]
    p = prune(t, 1)
    assert p.tokens.tolist() == [[5, 1], [6, 6]] and p.valid.tolist() == [[True, True], [True, False]]


def test_add_chains_shares_prefixes_on_the_device_and_scores_stay_monotone():
    drafted = ([9, 1, 2, 3], [0, 0, 0, 1], [0, 1, 1, 2], [1.0, 0.6, 0.3, 0.2])
    t = tree_of([drafted, drafted])
    chains = torch.tensor([[1, 3, 8, 8], [2, 5, -1, -1]])  # row 1's chain is two tokens long
    merged = add_chains(t, chains, torch.tensor([[0.9, 0.8, 0.4, 0.3], [0.5, 0.4, 0.0, 0.0]]))
    # row 0: 1 and 1->3 exist (scores raised), 8 and 8 are new below node 3; row 1: 2 exists, 5 is new
    assert merged.valid.tolist() == [[True] * 6 + [False] * 2, [True] * 5 + [False] * 3]
    assert merged.tokens.tolist() == [[9, 1, 2, 3, 8, 8, 9, 9], [9, 1, 2, 3, 5, 9, 9, 9]]
    assert merged.parents.tolist() == [[0, 0, 0, 1, 3, 4, 0, 0], [0, 0, 0, 1, 2, 0, 0, 0]]
    assert merged.depths.tolist() == [[0, 1, 1, 2, 3, 4, 1, 1], [0, 1, 1, 2, 2, 1, 1, 1]]
    expected = torch.tensor([[1, 0.9, 0.3, 0.8, 0.4, 0.3, 0, 0], [1, 0.6, 0.5, 0.2, 0.4, 0, 0, 0]])
    assert torch.allclose(merged.scores, expected)
    # a score above its parent's is lowered to it, down the whole path
    t = tree_of([([9, 1, 3, 8, 8], [0, 0, 1, 2, 3], [0, 1, 2, 3, 4], [1.0, 0.2, 0.5, 0.4, 0.3])])
    assert monotone(t.scores, t.parents)[0].tolist() == pytest.approx([1.0, 0.2, 0.2, 0.2, 0.2])


def test_drop_padding_removes_the_columns_no_row_uses_and_reindexes_parents():
    drafted = ([9, 1, 2, 3], [0, 0, 0, 1], [0, 1, 1, 2], [1.0, 0.6, 0.3, 0.2])
    chains = torch.tensor([[1, 3, 8, 8], [2, 5, -1, -1]])
    merged = add_chains(tree_of([drafted, drafted]), chains, torch.rand(2, 4))
    used = merged.valid.any(0).tolist()
    assert used == [True] * 6 + [False] * 2  # the chains' shared tokens left two columns unused
    dropped = drop_padding(merged, used)
    for field in ("tokens", "parents", "depths", "scores", "valid"):
        assert torch.equal(getattr(dropped, field), getattr(merged, field)[:, :6])
    # a capped node in the middle: the columns after it move left, and so do their children's parents
    t = tree_of(
        [([9, 1, 2, 3, 4, 5], [0, 0, 1, 2, 0, 4], [0, 1, 2, 3, 1, 2], [1.0, 0.9, 0.8, 0.7, 0.5, 0.4])]
    )
    capped = cap_depth(t, torch.tensor([2]))
    dropped = drop_padding(capped, capped.valid.any(0).tolist())
    assert dropped.tokens.tolist() == [[9, 1, 2, 4, 5]] and dropped.parents.tolist() == [[0, 0, 1, 0, 3]]
    assert dropped.depths.tolist() == [[0, 1, 2, 1, 2]] and dropped.valid.all()
    assert drop_padding(t, [True] * 6) is t


def test_ngram_index_finds_the_latest_earlier_continuation():
    idx = NgramIndex([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2], ngram=3)
    assert idx.lookup(4) == ([3, 7, 5, 1], 2)  # "1 2" last continued with "3 7 5 ..."
    idx.extend([3])
    assert idx.lookup(2) == ([7, 5], 3)
    assert NgramIndex([4, 5, 6], ngram=2).lookup(3) == ([], 0)  # no earlier match: nothing


def test_lookup_proposer_learns_its_acceptance_rates():
    lp = LookupProposer(max_tokens=3, ngram=2)
    ids = torch.tensor([[1, 2, 3, 4, 1, 2]])
    lp.prefill(Prefill(None, ids, torch.ones_like(ids, dtype=torch.bool), ids, torch.tensor([3])))
    tree = lp.propose(torch.tensor([3]), torch.tensor([6]))
    assert tree.tokens.tolist() == [[3, 4, 1, 2]] and tree.parents.tolist() == [[0, 0, 1, 2]]
    prior = tree.scores[0, 1].item()
    # the target emitted 4, 1, 9: the first two lookup tokens right, the third wrong
    emitted = torch.tensor([[4, 1, 9, 0]])
    lp.update(
        Accepted(
            None, torch.zeros(1, 4, dtype=torch.long), emitted, torch.tensor([3]), [3], torch.tensor([6])
        )
    )
    assert lp.tried[2, 1:4].tolist() == [1, 1, 1] and lp.hits[2, 1:4].tolist() == [1, 1, 0]
    assert lp.rows[0].tokens[-4:] == [3, 4, 1, 9]
    ids2 = torch.tensor([[1, 2, 3, 4, 1, 2, 3]])
    lp2 = LookupProposer(max_tokens=3, ngram=2)
    lp2.tried, lp2.hits = lp.tried, lp.hits
    lp2.prefill(
        Prefill(None, ids2[:, :-1], torch.ones(1, 6, dtype=torch.bool), ids2[:, :-1], torch.tensor([3]))
    )
    assert lp2.propose(torch.tensor([3]), torch.tensor([6])).scores[0, 1].item() > prior


# ---- the cost curve and the planner ----------------------------------------------------------------
def test_cost_curve_interpolates_and_extrapolates():
    c = CostCurve([1, 2, 4], [1.0, 1.2, 2.0])
    assert c(1) == 1.0 and c(3) == pytest.approx(1.6) and c(6) == pytest.approx(2.8)
    assert c.relative() == {1: 1.0, 2: 1.2, 4: 2.0}


def test_planner_verifies_only_what_pays():
    flat = Planner(CostCurve([1, 64], [1.0, 1.0]), batch=1)  # verifying is free: keep every likely node
    assert flat.best(torch.tensor([[0.9, 0.5, 0.2, 0.01]]))[0] == 4
    steep = Planner(CostCurve([1, 2, 64], [1.0, 1.5, 32.5]), batch=1)  # each node costs half a step
    assert steep.best(torch.tensor([[0.3, 0.2]]))[0] == 0
    assert steep.best(torch.tensor([[0.99, 0.98]]))[0] == 2
    # padding (invalid) nodes add nothing
    n, e, _ = flat.best(torch.tensor([[0.9, 0.9]]), torch.tensor([[True, False]]))
    assert e == pytest.approx(1.9) and n == 1


def test_planner_stops_drafting_when_a_pass_cannot_pay():
    p = Planner(CostCurve([1, 64], [1.0, 1.0]), batch=1)
    p.pass_s = 0.5
    assert p.expand(torch.tensor([[0.9, 0.8]]), torch.tensor([[0.9, 0.8]]), passes=1)
    assert not p.expand(torch.tensor([[0.05, 0.01]]), torch.tensor([[0.01, 0.01]]), passes=1)
    assert p.draft_s == 0.0  # judging a pass leaves this step's drafting time alone


def test_the_next_depth_stops_at_the_first_level_that_did_not_pay_and_grows_back():
    assert next_depth([True, False, True], depth=4, cap=4) == 2
    assert next_depth([False], depth=1, cap=4) == 1
    assert next_depth([True], depth=1, cap=4) == 2  # level 2 would have paid: grow by one
    assert next_depth([True, True, True], depth=3, cap=4) == 4
    assert next_depth([True, True, True], depth=4, cap=4) == 4  # never past the cap
    assert next_depth([], depth=1, cap=1) == 1


def test_the_planner_sets_the_next_depth_from_the_levels_a_step_drafted():
    p = Planner(CostCurve([1, 64], [1.0, 1.0]), batch=1)
    p.pass_s = 0.5
    sure, unsure = [0.9, 0.9], [0.01, 0.01]
    scores = torch.tensor([sure + [0.8, 0.8, 0.7, 0.7] + [0.01] * 4])  # levels of 2, 4 and 4 candidates
    counts = [2, 6, 10]
    assert p.replan(scores, torch.tensor([[sure, [0.8, 0.8], unsure]]), counts, cap=4) == 3
    assert p.depth == 3  # level 4 (over the third frontier) would not have paid
    assert p.replan(scores, torch.tensor([[sure, unsure, unsure]]), counts, cap=4) == 2
    assert p.replan(scores[:, :2], torch.tensor([[sure]]), [2], cap=4) == 2  # grows back
    assert p.replan(scores, torch.tensor([[sure, [0.8, 0.8], [0.7, 0.7]]]), counts, cap=3) == 3


def test_cost_cache_is_reused_only_for_the_same_key_and_anything_else_is_said(tmp_path, tiny_llama, capsys):
    model, _, _ = tiny_llama
    c1 = cached_model(model, "eager", tmp_path)
    assert "measuring the verify cost of this machine once" in capsys.readouterr().err
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"] == model_key(model, "eager")
    data = json.loads(files[0].read_text())
    data["seconds"] = [s * 1000 for s in data["seconds"]]
    files[0].write_text(json.dumps(data))
    assert cached_model(model, "eager", tmp_path).seconds == data["seconds"]  # same key: reused
    assert capsys.readouterr().err == ""  # quietly
    for edit, why in (
        ({"device": "cpu:another machine"}, "measured for another set-up (device 'cpu:another machine'"),
        ({"threads": 64}, "measured for another set-up (threads 64"),
    ):
        files[0].write_text(json.dumps({**data, "key": {**data["key"], **edit}}))
        fresh = cached_model(model, "eager", tmp_path)  # written elsewhere: said, measured again
        assert fresh.key == c1.key and fresh.seconds != data["seconds"]
        err = capsys.readouterr().err
        assert why in err and "measuring it again" in err and "measuring the verify cost" in err
    files[0].write_text("{not json")
    assert cached_model(model, "eager", tmp_path).key == c1.key
    assert "cannot be read (JSONDecodeError)" in capsys.readouterr().err


def test_the_cost_model_reads_the_context_and_batch_into_every_curve():
    m = CostModel([1, 2, 4], [1.0, 1.2, 2.0], 100, [1, 4], [1.9, 3.8], 1100)
    a, b = m.slopes()  # extra per cached token: (0.9 - 0) / 1000 at 1 token, 1.8 / 1000 at 4
    assert a == pytest.approx(0.0006) and b == pytest.approx(0.0003)
    assert m.curve(1, 100).seconds == pytest.approx([1.0, 1.2, 2.0])  # at c0: the short curve
    assert m.curve(1, 1100)(4) == pytest.approx(3.8) and m.curve(1, 1100)(1) == pytest.approx(1.9)
    long = m.curve(2, 600)  # two rows of n tokens: f(2n) + 500 (2a + b 2n)
    assert long.sizes == [2, 4, 8] and long(4) == pytest.approx(2.0 + 500 * (2 * a + 4 * b))
    assert m.curve(1, 0).seconds == pytest.approx([0.91, 1.08, 1.82])  # shorter than c0: less attention
    flat = CostModel([1, 2], [1.0, 1.0], 128)  # no long points (a model with few positions): no slope
    assert flat.slopes() == (0.0, 0.0) and flat.curve(3, 5000).seconds == [1.0, 1.0]


# ---- backends --------------------------------------------------------------------------------------
def test_backend_names_are_checked():
    cpu = torch.device("cpu")
    with pytest.raises(UserError, match="is not a backend; use one of auto, eager, onednn, cuda-graphs"):
        backends.resolve("fast", cpu, torch.float32)
    with pytest.raises(UserError, match="needs a CUDA device"):
        backends.resolve("cuda-graphs", cpu, torch.float32)
    assert backends.resolve("auto", cpu, torch.bfloat16) == "eager"
    if backends.onednn_available():
        assert backends.resolve("auto", cpu, torch.float32) == "onednn"
        with pytest.raises(UserError, match="packs float32 weights"):
            backends.resolve("onednn", cpu, torch.bfloat16)


@pytest.mark.skipif(not backends.onednn_available(), reason="this torch has no oneDNN")
def test_onednn_backend_matches_eager_and_is_removed_after_use(tiny_llama):
    model, tok, _ = tiny_llama
    ids = tok(PROMPTS[:2], return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        ref = model(**ids).logits
        with backends.applied("onednn", model):
            assert all("forward" in m.__dict__ for m in backends.linears(model))
            packed = model(**ids).logits
            with backends.applied("onednn", model):  # nested: the outer block keeps ownership
                pass
            assert all("forward" in m.__dict__ for m in backends.linears(model))
        assert not any("forward" in m.__dict__ for m in backends.linears(model))
    assert (packed - ref).abs().max() < 1e-4
    # a weight that changes is packed again
    lin = backends.linears(model)[0]
    x = torch.randn(3, lin.in_features)
    with torch.no_grad(), backends.applied("onednn", lin):
        before = lin(x)
        lin.weight.mul_(2)
        after = lin(x)
        lin.weight.div_(2)
    assert not torch.allclose(before, after)


# ---- the output is still the target's ---------------------------------------------------------------
FAST = [
    (None, {}, DecodeConfig(lookup=True)),  # lookup decoding alone
    ("medusa", dict(lm_head="shared"), DecodeConfig()),
    ("eagle", dict(version=1), DecodeConfig()),
    ("eagle", dict(version=3, draft_vocab_size=2000), DecodeConfig(total_tokens=3, depth=5)),
    ("eagle", dict(version=3, draft_vocab_size=2000), DecodeConfig(tree="chain3", backend="eager")),
]


@pytest.mark.parametrize("kind,kw,cfg", FAST)
def test_cost_aware_trees_and_lookup_keep_greedy_output(kind, kw, cfg):
    model, tok = get_target("llama")
    fp = fingerprint(model, tok)
    d = drafter(kind, model, fp, **kw) if kind else None
    gen = SpeculativeGenerator(model, d, tok, cfg)
    measured = [c.name for c in gen.choices if c.part == "target"]  # auto: the backend timed fastest
    assert gen.backend == (
        measured[0] if measured else backends.resolve(cfg.backend, torch.device("cpu"), torch.float32)
    )
    check_rows("llama", gen, PROMPTS + REPEATS)
    s = gen.last_stats
    assert s.backend == gen.backend and len(s.tree_tokens) == s.steps
    assert not any("forward" in m.__dict__ for m in backends.linears(model))


def test_lookup_decoding_accepts_text_that_repeats():
    """Lookup alone (no drafter): where the target's continuation repeats earlier text, a step
    accepts several tokens; the output is still the target's."""
    model, tok = get_target("llama")
    prompt = " ".join(["alpha beta gamma delta epsilon zeta eta theta"] * 6)
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=120, do_sample=False)
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(cost_aware=False))
    out = gen.generate(ids, max_new_tokens=120)
    assert torch.equal(out, ref)
    s = gen.last_stats
    assert max(s.accepted_lengths) >= 3 and s.target_forwards < 120


class SharedChainGenerator(SpeculativeGenerator):
    """The drafter's deepest branch holds the target's continuation (:class:`Oracle`) before the
    lookup chain is merged in, so where the text repeats the chain shares the drafted nodes and
    ``add_chains`` leaves the columns it did not need as padding."""

    def __init__(self, *a, continuations, prompt_lens, **kw):
        super().__init__(*a, **kw)
        self.cont, self.plen = continuations, prompt_lens

    def make_proposer(self):
        proposer = super().make_proposer()
        proposer.proposer = Oracle(proposer.proposer, self.cont, self.plen)
        return proposer


@pytest.mark.parametrize("prompts", [REPEATS[:1], REPEATS], ids=["one-row", "three-rows"])
def test_without_cost_aware_pruning_the_verified_width_is_the_real_nodes(monkeypatch, prompts):
    """With ``decode.cost_aware=false`` nothing prunes the merged tree, so the decoder drops the
    columns that are padding in every row: every verified column holds a real node in some row
    (one row: the width is its real nodes' count), steps that shared chain tokens verify fewer
    columns than the merge made, and the output is still the target's."""
    model, tok = get_target("llama")
    new = 30
    cont = [reference("llama", p, new) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    cfg = DecodeConfig(cost_aware=False, lookup=True, top_k_draft=2, total_tokens=8)
    gen = SharedChainGenerator(model, dflash(), tok, cfg, continuations=cont, prompt_lens=plen)
    merged, verified = [], []
    real_add, real_verify = combined.add_chains, SpeculativeGenerator._verify

    def add(*args):
        tree = real_add(*args)
        merged.append(tree.size)
        return tree

    def verify(self, state, tree, how):
        verified.append((merged.pop() if merged else None, tree.size, tree.valid.clone()))
        return real_verify(self, state, tree, how)

    monkeypatch.setattr(combined, "add_chains", add)
    monkeypatch.setattr(SpeculativeGenerator, "_verify", verify)
    check_rows("llama", gen, prompts, new=new)
    assert [size for _, size, _ in verified] == gen.last_stats.tree_tokens
    for _, size, valid in verified:
        assert valid.shape[1] == size and valid.any(0).all()
        assert len(prompts) > 1 or size == int(valid.sum())
    shrunk = [m - size for m, size, _ in verified if m is not None]
    assert len(shrunk) > 3 and min(shrunk) >= 0 and max(shrunk) > 0


def test_no_drafter_and_no_lookup_is_refused():
    model, tok = get_target("llama")
    with pytest.raises(UserError, match="nothing to draft with"):
        SpeculativeGenerator(model, None, tok, DecodeConfig(lookup=False))


def test_right_padded_batch_is_refused_in_one_line():
    model, tok = get_target("llama")
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True, padding_side="right")
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig())
    with pytest.raises(UserError, match="right padding") as e:
        gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=4)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("total,depth", [(2, 4), (3, 3), (4, 6)])
def test_dynamic_trees_smaller_than_their_depth(total, depth):
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    cfg = DecodeConfig(total_tokens=total, depth=depth, top_k_draft=2, cost_aware=False, lookup=False)
    gen = SpeculativeGenerator(model, d, tok, cfg)
    check_rows("llama", gen, PROMPTS[:3])
    assert max(gen.last_stats.tree_tokens) == total


def test_planner_trusts_scores_as_far_as_they_were_right():
    p = Planner(CostCurve([1, 2, 64], [1.0, 1.5, 32.5]), batch=1)
    confident = torch.tensor([[0.9, 0.9]])
    assert p.best(confident)[0] == 2
    for _ in range(40):  # the drafter claimed 1.8 accepted drafts a step and got none
        p.calibrate(1.8, 0.0)
    assert p.trust < 0.2 and p.best(confident)[0] == 0
    for _ in range(200):  # then it is right as often as it says
        p.calibrate(1.8, 1.8)
    assert p.trust == pytest.approx(1.0, abs=0.05) and p.best(confident)[0] == 2
