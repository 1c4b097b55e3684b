"""What the fast decoder must never get silently wrong: packed weights that follow the model, a
backend that lives for one call (and one thread), NaN draft scores, stop strings matched as
transformers matches them, and a planner that re-probes and skips the drafter when drafting
cannot pay. Planner tests inject costs and timings; none depends on the wall clock."""

from __future__ import annotations

import copy
import gc
import threading

import pytest
import torch
from torch import nn

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, cost, cost_cache, dynamic
from draftheads.decode import backend as backends
from draftheads.decode.cost import CostCurve, measure_curve
from draftheads.decode.cost_cache import cached_curve
from draftheads.decode.planner import MAX_WAIT, Planner
from draftheads.decode.select import from_rows, prune
from draftheads.decode.stop import Stopper
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import PROMPTS, check_rows, drafter

NAN = float("nan")
onednn = pytest.mark.skipif(not backends.onednn_available(), reason="this torch has no oneDNN")


def patched(*modules: nn.Module) -> list[nn.Linear]:
    """The linear layers whose forward is replaced (by a backend)."""
    return [m for m in backends.linears(*modules) if "forward" in m.__dict__]


def ids_of(tok, prompt: str) -> torch.Tensor:
    return tok(prompt, return_tensors="pt").input_ids


def greedy(model, ids: torch.Tensor, new: int, **kw) -> torch.Tensor:
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, **kw)


# ---- packed weights follow the model ---------------------------------------------------------------
@onednn
def test_packed_weights_see_writes_through_data_and_new_biases():
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    x = torch.randn(3, 16)
    with torch.no_grad():
        with backends.applied("onednn", lin):
            a = lin(x)
        lin.weight.data.mul_(2)  # keeps data_ptr and _version, as peft's merge does
        with backends.applied("onednn", lin):
            b = lin(x)
            lin.bias = nn.Parameter(torch.randn(8))  # replaced in the middle of a call
            c = lin(x)
        lin.bias.data.add_(1.0)
        with backends.applied("onednn", lin):
            d = lin(x)
        stock = nn.functional.linear(x, lin.weight, lin.bias)
    assert not torch.allclose(a, b) and not torch.allclose(b, c)
    torch.testing.assert_close(d, stock)
    torch.testing.assert_close(c, stock - 1.0)


@onednn
def test_a_lora_merge_between_two_decoder_calls_is_honoured():
    peft = pytest.importorskip("peft")
    base, tok = get_target("llama")
    model = copy.deepcopy(base)
    torch.manual_seed(0)
    lora = peft.LoraConfig(
        r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    wrapped = peft.get_peft_model(model, lora)
    gen = SpeculativeGenerator(
        model, None, tok, DecodeConfig(lookup=True, backend="onednn", cost_aware=False)
    )
    ids = ids_of(tok, PROMPTS[1])
    assert torch.equal(gen.generate(ids, max_new_tokens=12), greedy(model, ids, 12))
    wrapped.merge_and_unload()  # base_layer.weight.data += B A, then the LoRA layers go
    assert not patched(model)
    assert torch.equal(gen.generate(ids, max_new_tokens=12), greedy(model, ids, 12))


# ---- the patch lives for one call, one phase, one thread ---------------------------------------
@onednn
def test_a_failure_while_packing_or_inside_the_block_leaves_nothing_patched(monkeypatch):
    model, _ = get_target("llama")
    real = torch.ops.mkldnn._reorder_linear_weight
    calls = []

    def flaky(weight, groups):
        calls.append(weight.shape)
        if len(calls) == 3:
            raise RuntimeError("out of memory")
        return real(weight, groups)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", flaky)
    with pytest.raises(RuntimeError, match="out of memory"), backends.applied("onednn", model):
        pass
    assert len(calls) == 3 and not patched(model)
    monkeypatch.undo()
    with pytest.raises(ValueError), backends.applied("onednn", model):
        assert len(patched(model)) == len(backends.linears(model))
        raise ValueError("a failure in the middle of a call")
    assert not patched(model)


@onednn
def test_streams_leave_the_model_stock_between_steps_and_interleave_exactly():
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(backend="onednn"))
    prompts = [ids_of(tok, p) for p in PROMPTS[:2]]
    alone = [gen.generate(x, max_new_tokens=16)[0, x.shape[1] :].tolist() for x in prompts]
    plain_ids = ids_of(tok, PROMPTS[2])
    plain = greedy(model, plain_ids, 4)  # stock kernels, no backend
    streams = [gen.stream(x, max_new_tokens=16) for x in prompts]
    got: list[list[int]] = [[], []]
    live = {0, 1}
    while live:
        for i in sorted(live):
            step = next(streams[i], None)
            if step is None:
                live.discard(i)
                continue
            got[i] += step[0]
            assert not patched(model, d)  # suspended at a yield: nothing installed
            assert torch.equal(greedy(model, plain_ids, 4), plain)  # a plain call in between
    assert got == alone


@onednn
def test_packed_copies_are_released_when_a_call_ends():
    model, tok = get_target("llama")
    gen = SpeculativeGenerator(
        model, None, tok, DecodeConfig(lookup=True, backend="onednn", cost_aware=False)
    )
    ids = ids_of(tok, PROMPTS[0])
    stream = gen.stream(ids, max_new_tokens=6)
    next(stream)
    assert live_packs() > 0  # a stream holds its packing between steps ...
    del stream
    gen.generate(ids, max_new_tokens=6)
    assert live_packs() > 0  # the generator keeps its packing for the next call ...
    gen.packs.clear()
    assert live_packs() == 0  # ... until it lets it go (or is dropped)
    gen.generate(ids, max_new_tokens=6)
    del gen
    assert live_packs() == 0


@onednn
def test_a_generator_packs_once_and_repacks_a_weight_written_through_data(monkeypatch):
    model, tok = get_target("llama")
    model = copy.deepcopy(model)
    gen = SpeculativeGenerator(
        model, None, tok, DecodeConfig(lookup=True, backend="onednn", cost_aware=False)
    )
    ids = ids_of(tok, PROMPTS[0])
    gen.generate(ids, max_new_tokens=6)
    packs = []
    pack = backends._pack
    monkeypatch.setattr(backends, "_pack", lambda m: packs.append(m) or pack(m))
    gen.generate(ids, max_new_tokens=6)
    assert packs == []  # unchanged weights: the first call's packing serves
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight.data[:, 3].mul_(-2.0)  # one column, through .data: storage and version unchanged
    out = gen.generate(ids, max_new_tokens=12)
    assert packs == [head]
    assert torch.equal(out, greedy(model, ids, 12))


def live_packs() -> int:
    gc.collect()
    return sum(isinstance(o, backends._Packed) for o in gc.get_objects())


@onednn
def test_blocks_in_two_threads_neither_leak_nor_unpatch_each_other(monkeypatch):
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    x = torch.randn(3, 16)
    real = torch.ops.mkldnn._linear_pointwise
    packed_calls: list[int] = []

    def spy(*args):
        packed_calls.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    inside, leave, out = threading.Event(), threading.Event(), {}

    def worker() -> None:
        with torch.no_grad(), backends.applied("onednn", lin):
            inside.set()
            leave.wait(30)
            out["late"] = lin(x)  # after the main thread's block has ended

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(30)
    with torch.no_grad():
        stock = lin(x)  # no block in this thread: the stock kernel, though the worker's is active
        with backends.applied("onednn", lin):
            packed = lin(x)
    leave.set()
    t.join(30)
    assert packed_calls.count(threading.get_ident()) == 1 and packed_calls.count(t.ident) == 1
    torch.testing.assert_close(packed, stock)
    torch.testing.assert_close(out["late"], stock)
    assert not patched(lin)


# ---- NaN draft scores ------------------------------------------------------------------------------
def test_nan_scores_rank_lowest_and_the_root_always_stays():
    chain = from_rows([([7, 1, 2], [0, 0, 1], [0, 1, 2], [1.0, NAN, 0.5])], torch.device("cpu"))
    assert prune(chain, 0).tokens.tolist() == [[7]]
    p = prune(chain, 1)  # node 2 hangs under the NaN node: it ranks as low, and after it
    assert p.tokens.tolist() == [[7, 1]] and p.parents.tolist() == [[0, 0]]
    siblings = from_rows([([7, 1, 2], [0, 0, 0], [0, 1, 1], [1.0, NAN, 0.3])], torch.device("cpu"))
    assert prune(siblings, 1).tokens.tolist() == [[7, 2]]
    n, e, _ = Planner(CostCurve([1, 64], [1.0, 1.0]), batch=1).best(torch.tensor([[NAN, 0.5]]))
    assert (n, e) == (1, pytest.approx(1.5))
    # EAGLE-2: NaN children of a finite parent never displace it, nor hang from the root
    tokens, parents, depths, scores = dynamic.rerank(
        torch.tensor([9]),
        torch.tensor([[-1.0, -2.0, NAN, NAN]]),
        torch.tensor([[4, 5, 6, 7]]),
        torch.tensor([[-1, -1, 1, 1]]),
        torch.tensor([[1, 1, 2, 2]]),
        2,
    )
    assert (
        tokens.tolist() == [[9, 4, 5]] and parents.tolist() == [[0, 0, 0]] and depths.tolist() == [[0, 1, 1]]
    )
    c_scores, _, _ = dynamic.children(
        torch.tensor([[[NAN, NAN, NAN], [-0.1, -1.0, -3.0]]]), torch.zeros(1, 2), 2
    )
    assert c_scores[0, :2].tolist() == [float("-inf")] * 2
    assert dynamic.frontier(c_scores, 2).tolist() == [[2, 3]]


def _nan_everywhere(d, kind: str, monkeypatch) -> None:
    with torch.no_grad():
        for p in (d.blocks if kind == "medusa" else d.fc).parameters():
            p.fill_(NAN)


def _nan_every_other_node(d, kind: str, monkeypatch) -> None:
    logits = d.logits

    def some_nan(out: torch.Tensor) -> torch.Tensor:
        x = logits(out)
        if x.dim() == 3:  # a tree level: the children of every other frontier node overflow
            x[:, ::2] = NAN
        return x

    monkeypatch.setattr(d, "logits", some_nan)


@pytest.mark.parametrize("cost_aware", [True, False])
@pytest.mark.parametrize(
    "kind,kw,overflow",
    [
        ("eagle", dict(version=1), _nan_everywhere),
        ("eagle", dict(version=1), _nan_every_other_node),
        ("medusa", dict(lm_head="shared"), _nan_everywhere),
    ],
)
def test_a_drafter_that_overflows_still_gives_greedy_output(kind, kw, overflow, cost_aware, monkeypatch):
    model, tok = get_target("llama")
    d = drafter(kind, model, fingerprint(model, tok), **kw)
    overflow(d, kind, monkeypatch)
    cfg = DecodeConfig(cost_aware=cost_aware, lookup=False, top_k_draft=4, depth=3, total_tokens=4)
    check_rows("llama", SpeculativeGenerator(model, d, tok, cfg), PROMPTS[:3])


# ---- stop strings ---------------------------------------------------------------------------------
def test_stop_strings_stop_where_transformers_generate_stops():
    model, tok = get_target("llama")
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(lookup=True, cost_aware=False))
    cases = [  # (prompt, stop string, new tokens up to the stop)
        (PROMPTS[0], "is---", 1),  # completed by the first new token, across the prompt boundary
        (PROMPTS[3], "8 Insp", 1),
        (PROMPTS[3], " ambit ambit", 3),  # within the new tokens
        (PROMPTS[0], "Hello", 12),  # only in the prompt: never a stop
    ]
    for prompt, stop, n in cases:
        ids = ids_of(tok, prompt)
        ref = greedy(model, ids, 12, stop_strings=[stop], tokenizer=tok)
        assert ref.shape[1] == ids.shape[1] + n
        assert torch.equal(gen.generate(ids, max_new_tokens=12, stop_strings=[stop]), ref), (prompt, stop)


def test_a_long_multibyte_stop_string_is_found_however_many_tokens_it_spans():
    from transformers import StopStringCriteria

    _, tok = get_target("llama")
    stop = "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"  # 7 characters, 28 bytes, 21 tokens
    ids = tok("Say " + stop + " twice", add_special_tokens=False).input_ids
    prompt, new = ids[:1], ids[1:]
    criterion = StopStringCriteria(tok, [stop])
    first = next(i for i in range(len(new)) if criterion(torch.tensor([prompt + new[: i + 1]]), None)[0])
    stopper = Stopper(set(), [stop], tok, max_new_tokens=100)
    stopper.start(torch.tensor([prompt]), None)
    generated: list[int] = []
    for at in range(0, len(new), 3):  # as steps accept them: a few tokens at a time
        kept, done = stopper.cut(generated, new[at : at + 3], 0)
        generated += kept
        if done:
            break
    assert done and len(generated) == first + 1 and first >= 20


# ---- the planner: re-probes, skips the drafter, measures like its curve --------------------------
STEEP = CostCurve([1, 2, 64], [1.0, 1.5, 32.5])  # each node costs half a plain step
CONFIDENT = torch.tensor([[0.9, 0.9]])


def run_planner(p: Planner, steps: int, accept_rate: float, draft_s: float = 0.1) -> list[tuple[int, int]]:
    """Drive ``p`` as the decoder does (verify forwards take what the curve says, a draft
    ``draft_s``), drafts accepted at ``accept_rate`` of their score: ``(step, nodes verified)``
    for each step the drafter ran."""
    drafted = []
    for step in range(steps):
        n, spent = 0, 0.0
        if p.drafting():
            p.draft_s = spent = draft_s
            n = p.choose(CONFIDENT)
            drafted.append((step, n))
        p.observe(spent, int(spent > 0), p.curve(n + 1), n + 1)
        p.calibrate(0.9 * n, accept_rate * 0.9 * n)
    return drafted


def test_planner_reprobes_after_choosing_no_nodes_and_resumes_when_drafts_are_right():
    p = Planner(STEEP, batch=1)
    for _ in range(40):  # the drafter claimed 1.8 accepted drafts a step and got none
        p.calibrate(1.8, 0.0)
    drafted = run_planner(p, 300, accept_rate=0.0)
    assert drafted[0] == (0, 0)  # too little trust left: no node pays
    steps = [s for s, _ in drafted]
    assert all(n >= 1 for _, n in drafted[1:])  # but every probe after it verified one
    assert max(b - a for a, b in zip([-1, *steps], steps)) <= MAX_WAIT + 1  # and they never stop
    assert len(drafted) < 30  # though most steps ran without the drafter
    resumed = run_planner(p, 300, accept_rate=1.0)  # now the drafts are as right as they claim
    assert [s for s, _ in resumed][-100:] == list(range(200, 300))
    assert all(n == 2 for _, n in resumed[-100:]) and p.wait[True] == 1


def test_planner_skips_the_drafter_when_a_draft_costs_more_than_it_can_save():
    flat = CostCurve([1, 64], [1.0, 1.0])  # verifying is free: only drafting costs
    cheap = run_planner(Planner(flat, batch=1), 200, accept_rate=1.0, draft_s=0.1)
    dear = run_planner(Planner(flat, batch=1), 200, accept_rate=1.0, draft_s=5.0)
    assert len(cheap) == 200 and all(n == 2 for _, n in cheap)
    assert 5 < len(dear) < 20  # mostly without the drafter, yet it still probes now and then


@pytest.mark.parametrize("lookup", [True, False])
def test_steps_without_the_drafter_run_no_drafter_and_keep_greedy_output(lookup, monkeypatch):
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    runs = []
    hook = d.register_forward_hook(lambda *_: runs.append(1))
    monkeypatch.setattr(Planner, "drafting", lambda self, level=0: False)
    # verifying is free on this curve, so the lookup branch always pays (not the clock's call)
    flat = lambda self, batch=1, context=1: CostCurve([batch, 64 * batch], [1.0, 1.0])  # noqa: E731
    monkeypatch.setattr(SpeculativeGenerator, "cost_curve", flat)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=lookup))
    try:
        check_rows("llama", gen, PROMPTS[:3] + ["a b c d a b c d a b c d a b c"])
    finally:
        hook.remove()
    s = gen.last_stats
    assert not runs and s.undrafted_steps == s.steps > 0
    assert (max(s.tree_tokens) > 1) == lookup  # lookup branches still run: they need no model


def test_the_planner_times_the_verify_forward_as_its_curve_does(monkeypatch):
    model, tok = get_target("llama")
    gen = SpeculativeGenerator(model, drafter("eagle", model, fingerprint(model, tok), version=1), tok)
    clock = [0.0]
    verify, accept, observe = gen._verify, gen._accept, Planner.observe
    seen: list[float] = []

    def slow_verify(*args):
        out = verify(*args)
        clock[0] += 1.0
        return out

    def slow_accept(*args):  # compaction and the proposer's update: not what the curve measures
        out = accept(*args)
        clock[0] += 5.0
        return out

    def spy(self, draft_s, passes, verify_s, tokens):
        seen.append(verify_s)
        observe(self, draft_s, passes, verify_s, tokens)

    monkeypatch.setattr(gen, "_now", lambda: clock[0])
    monkeypatch.setattr(gen, "_verify", slow_verify)
    monkeypatch.setattr(gen, "_accept", slow_accept)
    monkeypatch.setattr(Planner, "observe", spy)
    gen.generate(ids_of(tok, PROMPTS[0]), max_new_tokens=8)
    assert seen and all(v == 1.0 for v in seen)
    s = gen.last_stats
    assert s.verify_time_s == 1.0 * len(seen) and s.bookkeeping_time_s == 5.0 * len(seen)
    assert sum(s.split().values()) == s.total_time_s == 6.0 * len(seen)


def test_cost_models_are_cached_per_set_up_and_never_overwrite_each_other(tmp_path, monkeypatch):
    """One model file per device, thread count and attention; every batch and context is read
    from it, never measured."""
    model, _ = get_target("llama")
    measured: list[dict] = []

    def fake(target, backend, **_):
        key = cost.model_key(target, backend)
        measured.append(key)
        return cost.CostModel([1, 2], [1.0, 2.0], 128, [1], [1.5], 1024, key)

    monkeypatch.setattr(cost_cache, "measure_model", fake)
    setups = [
        (device, threads, attention)
        for device in ("cpu:one", "cpu:two")
        for threads in (1, 2)
        for attention in ("sdpa", "eager")
    ]

    def curve_of(device, threads, attention, batch, context) -> CostCurve:
        monkeypatch.setattr(cost, "device_name", lambda _: device)
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        monkeypatch.setattr(model.config, "_attn_implementation", attention)
        return cached_curve(model, "eager", tmp_path, batch=batch, context=context)

    for setup in setups:
        for batch, context in ((1, 100), (4, 1000)):
            key = curve_of(*setup, batch, context).key
            assert (key["attention"], key["batch"], key["context"]) == (setup[2], batch, context)
    assert len(list(tmp_path.glob("*.json"))) == len(setups) == len(measured)
    for setup in setups:  # every set-up finds its own model again, measured nothing more
        assert curve_of(*setup, 2, 300).key == {**cost.model_key(model, "eager"), "batch": 2, "context": 300}
    assert len(measured) == len(setups)


def test_a_measured_curve_covers_the_batch_at_the_context_bucket():
    model, _ = get_target("llama")
    c = measure_curve(model, "eager", sizes=(1, 2), context=200, repeats=1, batch=3)
    assert c.sizes == [3, 6] and len(c.seconds) == 2 and all(s > 0 for s in c.seconds)
    assert (c.key["batch"], c.key["context"]) == (3, 256)


def test_eagle_reads_the_pairs_of_steps_verified_without_drafting(monkeypatch):
    """Steps the planner verifies without the drafter still reach its cache at the next pass, so
    acceptance after a probe is not lowered by holes (every other step skips drafting here)."""
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=3)
    flips = iter([True, False] * 100)
    monkeypatch.setattr(Planner, "drafting", lambda self, level=0: next(flips))
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=False))
    made = []
    make = gen.make_proposer
    monkeypatch.setattr(gen, "make_proposer", lambda: made.append(make()) or made[-1])
    ids = ids_of(tok, PROMPTS[0])
    out = gen.generate(ids, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out, greedy(model, ids, 24, eos_token_id=None))
    assert 0 < gen.last_stats.undrafted_steps < gen.last_stats.steps
    p = made[0]
    pending = p.pending[5][0] if p.pending is not None else 0
    # every pair the target has read: the prompt's and every emitted token but the last root
    assert p.lengths_cpu[0] + pending == ids.shape[1] + 24 - 1
    assert bool(p.valid[0].all())
