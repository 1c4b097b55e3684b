"""``SpeculativeGenerator.capture``: every graph a call replays is made before the call, on CPU
with the verifier and the drafting hook run eagerly (``capture=False``), as cuda-graphs makes them.

A call after the warm-up makes no new verify entry and no new drafting key, so on CUDA it
captures nothing; its output is still the target's greedy output.
"""

from __future__ import annotations

import pytest

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, static
from draftheads.decode.static import shapes
from draftheads.decode.static.forward import _SHARED
from draftheads.decode.static.graphs import _DRAFT_GRAPHS
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_compile_dflash import fixed_drafting
from tests.test_decode import PROMPTS, batch, drafter, reference
from tests.test_decode_dflash import dflash

NEW = 20


def make_drafter(kind: str, model, tok):
    if kind == "dflash":
        return dflash("llama")
    return drafter("eagle", model, fingerprint(model, tok), version=3, draft_vocab_size=2000)


def test_capture_is_a_no_op_off_cuda_graphs():
    model, tok = get_target("llama")
    d = make_drafter("eagle3", model, tok)
    shared = _SHARED.get(model)  # the cached model may hold another test's verifier
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(backend="eager"))
    assert gen.capture(batch=2, context=64) == 0.0
    assert static.verifier(gen) is None
    assert d not in _DRAFT_GRAPHS and _SHARED.get(model) is shared  # nothing registered by this call
    with pytest.raises(UserError, match=r"capture\(batch=0, context=64\): both must be at least 1"):
        gen.capture(batch=0, context=64)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_call_after_capture_makes_no_new_graph_and_is_the_targets_output(kind):
    model, tok = get_target("llama")
    cfg = DecodeConfig(cost_aware=False, lookup=False, top_k_draft=3, depth=3, total_tokens=8)
    gen = fixed_drafting(SpeculativeGenerator(model, make_drafter(kind, model, tok), tok, cfg))
    prompts = PROMPTS[:3]
    enc = batch(tok, prompts)
    P = enc.input_ids.shape[1]
    seconds = gen.capture(batch=len(prompts), context=P + NEW)
    assert seconds > 0
    verifier = gen.static_verifier
    made = list(verifier.entries)
    # every bucket, largest first, for 3 rows down to 1, on one capacity and lease
    assert [k[:2] for k in made] == [(b, s) for b in (3, 2, 1) for s in sorted(shapes.BUCKETS, reverse=True)]
    assert len({k[2:] for k in made}) == 1
    assert {k[3] for k in made} == {tuple(gen.make_proposer().hidden_layers)}
    drafted = set(gen.graphs.calls)
    assert sorted(k[1] for k in drafted) == [1, 2, 3]  # the drafting call per batch size
    assert verifier.pool.free == [0] and gen.graphs.pool.free == [0]  # the warm-up's leases returned
    gen.graphs.calls.clear()

    refs = [reference("llama", p, NEW) for p in prompts]
    eos = refs[0][5]  # row 0 stops early and leaves the batch
    out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=NEW, eos_token_id=eos)
    for row, ref in zip(out[:, P:].tolist(), refs):
        want = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert row[: len(want)] == want
    assert list(verifier.entries) == made  # the call verified on warmed-up entries only
    assert gen.graphs.calls and set(gen.graphs.calls) <= drafted
    assert len({k[1] for k in gen.graphs.calls}) > 1  # it drafted at more than one batch size
