"""The static-shape verify path (decode/static/) on CPU: same tokens as the DynamicCache path.

The CUDA graph capture itself needs a GPU (bench/lab/gpu_check.py runs it); everything it replays
(fixed-capacity buffers, padded trees, static masks, in-place compaction) runs here eagerly.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import DynamicCache

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, kv, static
from draftheads.decode.proposers import WithLookup
from draftheads.decode.static import KVPool, StaticKV, StaticVerifier, shapes
from draftheads.decode.tree import Tree, ancestor_mask
from draftheads.decode.verify import greedy_accept
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import CASES, PROMPTS, OracleGenerator, batch, drafter, reference


def test_bucket_and_capacity_sizes():
    assert [static.bucket(n) for n in (1, 2, 3, 5, 9, 33, 64, 65, 130)] == [1, 2, 4, 8, 16, 64, 64, 128, 192]
    assert [static.capacity_for(n) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]


def small_tree() -> Tree:
    """Two rows, 3 nodes: a root with two children (row 1's second child is padding)."""
    return Tree(
        torch.tensor([[5, 6, 7], [8, 9, 8]]),
        torch.tensor([[0, 0, 1], [0, 0, 0]]),
        torch.tensor([[0, 1, 2], [0, 1, 1]]),
        torch.tensor([[1.0, 0.5, 0.2], [1.0, 0.4, 0.0]]),
        torch.tensor([[True, True, True], [True, True, False]]),
    )


def test_padding_nodes_hang_from_the_root_and_are_never_accepted():
    tree = small_tree()
    padded = static.pad_tree(tree, 8)
    assert padded.size == 8
    assert torch.equal(padded.tokens[:, 3:], tree.tokens[:, :1].expand(2, 5))
    assert padded.parents[:, 3:].eq(0).all() and padded.depths[:, 3:].eq(1).all()
    assert not padded.valid[:, 3:].any() and torch.equal(padded.valid[:, :3], tree.valid)
    anc = ancestor_mask(tree.parents, tree.max_depth)
    assert torch.equal(static.pad_ancestors(anc, 8), ancestor_mask(padded.parents, padded.max_depth))
    # logits that favour the padding node's token everywhere: padding still is never accepted
    logits = torch.zeros(2, 8, 10)
    logits[..., 5] = logits[..., 8] = 1.0
    best, _ = greedy_accept(
        logits, padded.tokens, padded.parents, padded.depths, static.pad_ancestors(anc, 8), padded.valid
    )
    assert (best < 3).all()


def test_static_mask_shows_valid_slots_then_the_tree_and_hides_the_rest():
    kv_valid = torch.tensor([[False, True, True], [True, True, True]])
    anc = ancestor_mask(small_tree().parents, 2)
    m = static.static_mask(kv_valid, anc, 10, torch.float32)
    allowed = m[:, 0] == 0
    assert m.shape == (2, 1, 3, 10)
    assert torch.equal(allowed[:, :, :3], kv_valid[:, None].expand(2, 3, 3))
    assert torch.equal(allowed[:, :, 3:6], anc)
    assert not allowed[:, :, 6:].any()


def filled(B: int, S: int, layers: int = 2) -> DynamicCache:
    cache = DynamicCache()
    for i in range(layers):
        cache.update(torch.randn(B, 2, S, 4), torch.randn(B, 2, S, 4), i)
    return cache


def test_compaction_row_selection_and_resize_match_the_dynamic_cache():
    torch.manual_seed(0)
    dyn = filled(2, 12)
    st = StaticKV.adopt(dyn, KVPool(), 8)
    assert st.capacity == 256 and kv.seq_length(st) == 12
    src = torch.tensor([[9, 10, 11], [8, 8, 8]])
    dst = torch.tensor([[5, 6, 7], [3, 4, 5]])
    kv.compact(dyn, src, dst, 8)
    kv.compact(st, src, dst, 8)
    for a, b in zip(kv.cache_layers(dyn), kv.cache_layers(st)):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    buffers = [layer.k_buf for layer in st.layers]
    assert all(layer.k_buf.data_ptr() == b.data_ptr() for layer, b in zip(st.layers, buffers))  # in place
    rows = torch.tensor([1])
    kv.select_rows(dyn, rows)
    kv.select_rows(st, rows)
    st.resize(512)
    assert st.batch == 1 and st.capacity == 512
    for a, b in zip(kv.cache_layers(dyn), kv.cache_layers(st)):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def static_generator(model, d, tok, cfg) -> SpeculativeGenerator:
    gen = SpeculativeGenerator(model, d, tok, cfg)
    gen.static_verifier = StaticVerifier(model, capture=False)
    return gen


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=["medusa", "eagle2", "eagle3-static"])
def test_static_path_is_token_identical_to_the_dynamic_cache_path(case):
    kind, kw, tree = case
    model, tok = get_target("llama")
    d = drafter(kind, model, fingerprint(model, tok), **kw)
    cfg = DecodeConfig(tree=tree, cost_aware=False)
    for prompts in (PROMPTS[:1], PROMPTS[1:3]):  # batch 1, and a left-padded batch of 2
        enc = batch(tok, prompts)
        dyn = SpeculativeGenerator(model, d, tok, cfg).generate(
            enc.input_ids, enc.attention_mask, max_new_tokens=20
        )
        gen = static_generator(model, d, tok, cfg)
        for _ in range(2):  # the second call reuses the pooled buffers
            out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=20)
            assert torch.equal(out, dyn)
        for i, p in enumerate(prompts):
            assert out[i, enc.input_ids.shape[1] :].tolist() == reference("llama", p, 20)
        assert gen.static_verifier.entries and all(k[2] == 256 for k in gen.static_verifier.entries)


def test_long_acceptance_finished_rows_and_cache_growth_on_static_buffers(monkeypatch):
    """Oracle drafts make rows accept several tokens; one row stops early (its row leaves the
    static batch); a small capacity makes the cache grow mid-call."""
    monkeypatch.setattr(shapes, "MIN_CAPACITY", 16)
    monkeypatch.setattr(shapes, "BUCKETS", (1, 2, 4, 8, 16))
    model, tok = get_target("llama")
    prompts = PROMPTS[:2]
    cont = [reference("llama", p, 30) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    cfg = DecodeConfig(tree="auto", cost_aware=False, lookup=False, depth=4, top_k_draft=3, total_tokens=10)
    eos = cont[0][6]
    enc = batch(tok, prompts)
    runs = []
    for use_static in (False, True):
        gen = OracleGenerator(model, d, tok, cfg, continuations=cont, prompt_lens=plen)
        if use_static:
            gen.static_verifier = StaticVerifier(model, capture=False)
        runs.append(gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=30, eos_token_id=eos))
    assert torch.equal(runs[0], runs[1])
    assert gen.last_stats.tau > 1.5
    keys = gen.static_verifier.entries
    assert {k[0] for k in keys} == {1, 2} and len({k[2] for k in keys}) >= 2  # rows left; cache grew


def test_static_path_is_off_unless_asked_and_capture_needs_cuda():
    model, tok = get_target("llama")
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(lookup=True, backend="eager"))
    assert static.verifier(gen) is None
    with pytest.raises(UserError, match="cuda-graphs"):
        SpeculativeGenerator(model, None, tok, DecodeConfig(lookup=True, backend="cuda-graphs"))
    with pytest.raises(UserError, match="CUDA device"):
        StaticVerifier(model, capture=True)


def interleaved(streams) -> list[list[int]]:
    """Row 0's tokens of each stream, advancing them in turn (a server serving two requests)."""
    got: list[list[int]] = [[] for _ in streams]
    live = list(streams)
    while any(s is not None for s in live):
        for i, s in enumerate(live):
            if s is None:
                continue
            try:
                got[i] += next(s)[0]
            except StopIteration:
                live[i] = None
    return got


def test_two_live_streams_of_one_batch_size_keep_their_own_cache():
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    gen = static_generator(model, d, tok, DecodeConfig(tree="auto", cost_aware=False))
    encs = [batch(tok, [p]) for p in PROMPTS[:2]]
    got = interleaved([gen.stream(e.input_ids, e.attention_mask, max_new_tokens=16) for e in encs])
    for p, row in zip(PROMPTS[:2], got):
        assert row == reference("llama", p, 16)
    assert {k[4] for k in gen.static_verifier.entries} == {0, 1}  # one lease per live stream
    assert sorted(gen.static_verifier.pool.free) == [0, 1]  # both returned when the streams ended


def test_generators_of_one_model_share_a_verifier_and_lease_its_buffers_per_stream():
    model, tok = get_target("llama")
    fp = fingerprint(model, tok)
    assert static.shared(model, capture=False) is static.shared(model, capture=False)
    gens = []
    for kind, kw in (("medusa", {}), ("eagle", dict(version=1))):
        gen = SpeculativeGenerator(model, drafter(kind, model, fp, **kw), tok, DecodeConfig(cost_aware=False))
        gen.static_verifier = static.shared(model, capture=False)
        gens.append(gen)
    encs = [batch(tok, [p]) for p in PROMPTS[2:4]]
    streams = [g.stream(e.input_ids, e.attention_mask, max_new_tokens=12) for g, e in zip(gens, encs)]
    for p, row in zip(PROMPTS[2:4], interleaved(streams)):
        assert row == reference("llama", p, 12)


def test_the_shared_verifier_does_not_keep_its_model_alive():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32
    )
    model = LlamaForCausalLM(cfg)
    static.shared(model, capture=False)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


class FixedDrafting(OracleGenerator):
    """EAGLE drafting at fixed depth and top-k on the drafter's static buffers, as
    ``decode.backend=cuda-graphs`` captures it, here without capture."""

    def make_proposer(self):
        oracle = super().make_proposer()
        inner = oracle.inner.proposer if isinstance(oracle.inner, WithLookup) else oracle.inner
        inner.graphs = static.Graphs(self.device, capture=False)
        return oracle


@pytest.mark.parametrize(
    "kw", [dict(version=1), dict(version=3, draft_vocab_size=2000)], ids=["eagle1", "eagle3"]
)
def test_fixed_shape_drafting_gives_the_targets_output_with_rows_leaving(kw):
    model, tok = get_target("llama")
    prompts = PROMPTS[:2]
    cont = [reference("llama", p, 30) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    d = drafter("eagle", model, fingerprint(model, tok), **kw)
    cfg = DecodeConfig(tree="auto", cost_aware=False, lookup=False, depth=4, top_k_draft=3, total_tokens=10)
    enc = batch(tok, prompts)
    eos = cont[0][6]
    gen = FixedDrafting(model, d, tok, cfg, continuations=cont, prompt_lens=plen)
    gen.static_verifier = StaticVerifier(model, capture=False)
    out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=30, eos_token_id=eos)
    P = enc.input_ids.shape[1]
    assert out[0, P : P + 7].tolist() == cont[0][:7]  # stopped at its eos, and left the batch
    assert out[1, P:].tolist() == cont[1]
    widths = gen.last_stats.tree_tokens
    assert gen.last_stats.tau > 1.5 and set(widths[:-2]) == {10}  # fixed shape every step ...
    assert widths[-2:] == [4, 1]  # ... but the last two: the nodes past the tokens left are not verified
