"""The speculative generator end to end: output identity, batches, stops, devices (sampling: test_decode_sampling)."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.proposers import Tree
from draftheads.decode.tree import ancestor_mask
from draftheads.heads import EagleDrafter, MedusaHeads, fingerprint
from draftheads.heads.dflash import DFlashDrafter
from draftheads.heads.peagle import PEagleDrafter
from tests.conftest import get_target

PROMPTS = [
    "Hello, my name is",
    "The capital of France is a city that",
    "def fibonacci(n):",
    "1 2 3 4 5 6 7 8",
    "Once upon a time, there was a little",
    "Q: What is 12 times 7?\nA:",
]
NEW = 20


STATIC = "[[0],[1],[0,0],[1,0],[0,0,0]]"


def drafter(kind: str, model, fp, **kw):
    torch.manual_seed(0)
    if kind == "medusa":
        d = MedusaHeads(fp, num_heads=3, **kw).attach(model)
        if kw.get("lm_head") == "copy":
            d.init_lm_heads_from_target()
        with torch.no_grad():  # random ResBlocks: heads no longer just repeat the next token
            for p in d.blocks.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        return d
    if kind == "dflash":
        return DFlashDrafter(fp, model.config.to_dict(), **kw).attach(model)
    if kind == "peagle":
        d = PEagleDrafter(fp, model.config.to_dict(), **kw).attach(model)
        d.init_lm_head_from_target()
        d.init_embedding_from_target()
        return d
    d = EagleDrafter(fp, target_config=model.config.to_dict(), **kw).attach(model)
    if kw.get("version") == 3:
        d.init_lm_head_from_target()
    return d


_refs: dict = {}


def reference(kind: str, prompt: str, new: int = NEW) -> list[int]:
    """The target's own greedy continuation (transformers generate), cached per process."""
    key = (kind, prompt, new)
    if key not in _refs:
        model, tok = get_target(kind)
        ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        _refs[key] = out[0, ids.shape[1] :].tolist()
    return _refs[key]


def batch(tok, prompts):
    return tok(prompts, return_tensors="pt", padding=True, padding_side="left")


def check_rows(kind, gen, prompts, new=NEW, **kw):
    _, tok = get_target(kind)
    enc = batch(tok, prompts)
    out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=new, **kw)
    P = enc.input_ids.shape[1]
    assert torch.equal(out[:, :P], enc.input_ids)
    for i, p in enumerate(prompts):
        ref = reference(kind, p, new)
        assert out[i, P : P + len(ref)].tolist() == ref, (kind, p)
    return out


# ---- greedy identity on every tiny architecture --------------------------------------------------
CASES = [
    ("medusa", dict(lm_head="shared"), "auto"),
    ("medusa", dict(lm_head="copy"), STATIC),
    ("eagle", dict(version=1), "auto"),  # EAGLE-2 dynamic tree
    ("eagle", dict(version=1), STATIC),
    ("eagle", dict(version=3, draft_vocab_size=2000), "auto"),
    ("eagle", dict(version=3, draft_vocab_size=2000), STATIC),
]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gpt2"])
def test_greedy_identity_every_architecture_and_drafter(arch):
    model, tok = get_target(arch)
    fp = fingerprint(model, tok)
    for kind, kw, tree in CASES:
        if arch == "gpt2" and kw.get("version") == 3:
            continue  # EAGLE-3 needs q/k/v projections; GPT-2 has a fused c_attn
        gen = SpeculativeGenerator(model, drafter(kind, model, fp, **kw), tok, DecodeConfig(tree=tree))
        check_rows(arch, gen, PROMPTS)
        stats = gen.last_stats
        assert stats.new_tokens == len(PROMPTS) * NEW == len(PROMPTS) + sum(stats.accepted_lengths)
        assert 1 < stats.target_forwards <= NEW


# ---- an oracle that makes the drafts right, to exercise long acceptance and KV compaction -------
class Oracle:
    """Wraps a real proposer; overwrites the tokens along one branch of its tree with the
    target's true greedy continuation, right for a row-dependent number of depths, so rows
    accept different lengths along a path that is not the first one."""

    def __init__(self, inner, continuations: list[list[int]], prompt_lens: list[int]) -> None:
        self.inner, self.cont, self.plen = inner, continuations, prompt_lens
        self.step = 0

    @property
    def hidden_layers(self):
        return self.inner.hidden_layers

    def prefill(self, batch):
        self.rows = list(range(batch.input_ids.shape[0]))
        self.inner.prefill(batch)

    def update(self, step):
        self.inner.update(step)

    def select_rows(self, rows):
        self.rows = [self.rows[i] for i in rows.tolist()]
        self.inner.select_rows(rows)

    def propose(self, root, pos, plan=None) -> Tree:
        tree = self.inner.propose(root, pos)
        tokens = tree.tokens.clone()
        anc = ancestor_mask(tree.parents, tree.max_depth)
        self.step += 1
        for i, b in enumerate(self.rows):
            deepest = int(tree.depths[i].argmax())  # the first node of the largest depth
            chain = anc[i, deepest].nonzero()[:, 0].tolist()[1:]
            right = (b + self.step) % (len(chain) + 1)  # 0..depth drafts right
            gen = int(pos[i]) - self.plen[b] + 1  # index of the first draft in the continuation
            for d, node in enumerate(chain[:right]):
                if gen + d < len(self.cont[b]):
                    tokens[i, node] = self.cont[b][gen + d]
        return Tree(tokens, tree.parents, tree.depths, tree.scores, tree.valid)


def ORACLE_CFG(tree: str) -> DecodeConfig:  # noqa: N802
    """The whole drafted tree is verified (no cost-aware pruning), so the oracle's branch is."""
    return DecodeConfig(tree=tree, cost_aware=False)


class OracleGenerator(SpeculativeGenerator):
    def __init__(self, *a, continuations, prompt_lens, **kw):
        super().__init__(*a, **kw)
        self.cont, self.plen = continuations, prompt_lens

    def make_proposer(self):
        return Oracle(super().make_proposer(), self.cont, self.plen)


@pytest.mark.parametrize(
    "kind,kw,tree", [CASES[0], CASES[2], CASES[3], ("eagle", dict(version=3, draft_vocab_size=2000), "auto")]
)
def test_oracle_drafts_are_accepted_and_output_is_still_the_targets(kind, kw, tree):
    arch = "qwen2"
    model, tok = get_target(arch)
    fp = fingerprint(model, tok)
    prompts = PROMPTS[:4]
    cont = [reference(arch, p, 40) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    # every node verified: the oracle drafts whatever the plan, so on a tiny target the cost-aware
    # planner would rightly stop drafting, and this test is about acceptance
    cfg = DecodeConfig(tree=tree, depth=4, top_k_draft=3, total_tokens=10, cost_aware=False)
    gen = OracleGenerator(
        model, drafter(kind, model, fp, **kw), tok, cfg, continuations=cont, prompt_lens=plen
    )
    check_rows(arch, gen, prompts, new=40)
    stats = gen.last_stats
    assert stats.tau > 1.8  # rows really accept several drafts per step ...
    assert len(set(stats.accepted_lengths)) >= 3  # ... and different numbers of them
    assert stats.per_position_acceptance[0] > stats.per_position_acceptance[-1] > 0


# ---- batches: each row equals that row decoded alone -----------------------------------------------
def test_batch_rows_equal_single_row_decoding_with_left_padding():
    arch = "llama"
    model, tok = get_target(arch)
    fp = fingerprint(model, tok)
    prompts = ["Hi", "A much longer prompt than the first one, with commas, and more words", "x = 1"]
    cont = [reference(arch, p, 30) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    for kind, kw, tree in (CASES[0], CASES[2]):
        d = drafter(kind, model, fp, **kw)
        gen = OracleGenerator(model, d, tok, ORACLE_CFG(tree), continuations=cont, prompt_lens=plen)
        enc = batch(tok, prompts)
        out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=30)
        for i, p in enumerate(prompts):
            ids = tok(p, return_tensors="pt").input_ids
            solo = OracleGenerator(
                model, d, tok, ORACLE_CFG(tree), continuations=[cont[i]], prompt_lens=[plen[i]]
            ).generate(ids, max_new_tokens=30)
            assert out[i, enc.input_ids.shape[1] :].tolist() == solo[0, ids.shape[1] :].tolist()


# ---- EOS, stop strings and max_new_tokens ---------------------------------------------------------
def test_eos_stop_strings_and_max_new_tokens_are_exact():
    arch = "mistral"
    model, tok = get_target(arch)
    fp = fingerprint(model, tok)
    prompts = PROMPTS[:3]
    cont = [reference(arch, p, 30) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    gen = OracleGenerator(
        model,
        drafter("medusa", model, fp),
        tok,
        DecodeConfig(tree=STATIC),
        continuations=cont,
        prompt_lens=plen,
    )
    enc = batch(tok, prompts)
    P = enc.input_ids.shape[1]
    pad = gen.pad_id()
    # EOS: make row 0's 6th generated token and row 2's 11th the EOS id; they must end right there
    eos = [cont[0][5], cont[2][10]]
    out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=30, eos_token_id=eos)
    for i in range(3):
        row = out[i, P:].tolist()
        first = next((j for j, t in enumerate(cont[i]) if t in eos), None)
        n = 30 if first is None else first + 1
        assert row[:n] == cont[i][:n] and all(t == pad for t in row[n:])
    assert out.shape[1] == P + max((next((j for j, t in enumerate(c) if t in eos), 29) + 1) for c in cont)
    # max_new_tokens exact for every value, even when a step accepts past it
    for m in (1, 2, 5, 13):
        out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=m, eos_token_id=[])
        assert out.shape[1] == P + m and gen.last_stats.new_tokens == 3 * m
    # stop string: the text of row 1 stops at the token that completes it
    text = tok.decode(cont[1])
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    gen.cont, gen.plen = cont[1:2], plen[1:2]
    out = gen.generate(
        enc.input_ids[1:2], enc.attention_mask[1:2], max_new_tokens=30, stop_strings=[stop], eos_token_id=[]
    )
    got = out[0, P:].tolist()
    assert stop in tok.decode(got) and stop not in tok.decode(got[:-1])
    assert got == cont[1][: len(got)]


def test_stream_yields_tokens_as_accepted():
    arch = "llama"
    model, tok = get_target(arch)
    gen = SpeculativeGenerator(model, drafter("eagle", model, fingerprint(model, tok), version=1), tok)
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids
    steps = list(gen.stream(ids, max_new_tokens=12))
    assert sum((s[0] for s in steps), []) == reference(arch, PROMPTS[0], 12)
    assert len(steps) == gen.last_stats.target_forwards
    assert gen.last_stats.new_tokens == 12 and gen.last_stats.tau >= 1.0


COARSE: dict[str, object] = {}  # coarse curves by their set-up's key, shared by the tests here


def coarse_curves(monkeypatch) -> None:
    """Generators read a cost curve measured at five sizes, once per set-up and batch size: the
    planner prunes on a measured curve all the same, without the full measurement (at 4000
    rows, most of a sampling test's time). The model a generator measures when it is built
    (read only through ``cost_curve``) is measured as coarsely: on the real target, the full
    measurement is most of a short test's time."""
    from draftheads.decode.cost import CONTEXT_BUCKET, CostModel, curve_key, measure_curve

    def coarse_model(target, backend: str, cache_dir=None) -> CostModel:
        key = json.dumps({**curve_key(target, backend), "batch": "model"}, sort_keys=True)
        if key not in COARSE:
            c = measure_curve(target, backend, sizes=(1, 2, 4, 8, 16), repeats=1)
            COARSE[key] = CostModel(list(c.sizes), list(c.seconds), CONTEXT_BUCKET)
        return COARSE[key]

    def coarse(self, batch=1, context=1):
        key = json.dumps(curve_key(self.target, self.backend, batch), sort_keys=True)
        if key not in COARSE:
            COARSE[key] = measure_curve(
                self.target, self.backend, sizes=(1, 2, 4, 8, 16), repeats=1, batch=batch
            )
        return COARSE[key]

    monkeypatch.setattr(SpeculativeGenerator, "cost_curve", coarse)
    monkeypatch.setattr("draftheads.decode.generator.cached_model", coarse_model)


def test_bf16_target_runs_on_cpu_and_matches_its_own_greedy():
    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads.target.load import load_target

    model, tok = load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama", dtype="bfloat16"))
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    gen = SpeculativeGenerator(model, d, tok)
    assert next(d.parameters()).dtype == torch.bfloat16
    ids = tok(PROMPTS[1], return_tensors="pt").input_ids
    out = gen.generate(ids, max_new_tokens=10)
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    # bf16 rounding differs between a tree forward and a 1-token forward; the first tokens agree
    assert (
        out[0, ids.shape[1] : ids.shape[1] + 3].tolist() == ref[0, ids.shape[1] : ids.shape[1] + 3].tolist()
    )


def test_user_errors_are_one_line():
    model, tok = get_target("llama")
    fp = fingerprint(model, tok)
    med = drafter("medusa", model, fp)
    with pytest.raises(UserError, match="has depth 4 but the drafter has 3 heads"):
        SpeculativeGenerator(model, med, tok, DecodeConfig(tree="chain4"))
    gen = SpeculativeGenerator(model, med, tok)
    ids = tok("hi", return_tensors="pt").input_ids
    with pytest.raises(UserError, match="temperature"):
        gen.generate(ids, do_sample=True, temperature=0.0)
    with pytest.raises(UserError, match="max_new_tokens"):
        gen.generate(ids, max_new_tokens=0)
    with pytest.raises(UserError, match="need a tokenizer"):
        SpeculativeGenerator(model, med).generate(ids, stop_strings=["x"])
    impl = model.config._attn_implementation
    try:
        model.config._attn_implementation = "flash_attention_2"
        with pytest.raises(UserError, match="cannot take a tree attention mask") as e:
            SpeculativeGenerator(model, med, tok)
        assert "\n" not in str(e.value)
    finally:
        model.config._attn_implementation = impl


def test_eager_attention_works_too():
    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads.target.load import load_target

    model, tok = load_target(
        TargetConfig(name_or_path="tiny-qwen2", tiny="qwen2", attn_implementation="eager")
    )
    gen = SpeculativeGenerator(model, drafter("medusa", model, fingerprint(model, tok)), tok)
    check_rows("qwen2", gen, PROMPTS[:2])


@pytest.mark.slow
def test_smollm2_greedy_identity(smollm2, monkeypatch):
    """The real target's greedy text, token for token, under Medusa's static tree and EAGLE's
    cost-aware dynamic one. The cost curve is measured coarsely here (what the planner reads is
    a measured curve all the same; its full measurement is the bench's)."""
    model, tok = smollm2
    fp = fingerprint(model, tok)
    msgs = [[{"role": "user", "content": q}] for q in ("What is 2+2?", "Name three colors.")]
    texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs]
    refs = []
    for t in texts:
        ids = tok(t, return_tensors="pt").input_ids
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
        refs.append(ref[0, ids.shape[1] :].tolist())
    coarse_curves(monkeypatch)
    enc = batch(tok, texts)
    P = enc.input_ids.shape[1]
    for d in (drafter("medusa", model, fp), drafter("eagle", model, fp, version=1)):
        out = SpeculativeGenerator(model, d, tok).generate(
            enc.input_ids, enc.attention_mask, max_new_tokens=24
        )
        for i, ref in enumerate(refs):
            assert out[i, P : P + len(ref)].tolist() == ref
