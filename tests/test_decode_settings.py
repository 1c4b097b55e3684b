"""The decoder against the target's own limits and settings: positions, generation config, seeds,
and the context length through the commands."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GenerationConfig

from draftheads.conf.cli import main
from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.context import cap_depth, depth_caps
from draftheads.decode.processing import Processing, resolve
from draftheads.decode.select import from_rows
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import PROMPTS, batch, coarse_curves, drafter
from tests.test_decode_sampling import small_vocab_target


# ---- positions ------------------------------------------------------------------------------------
def gpt2_with_positions(n: int):
    """A tiny random GPT-2 with ``n`` learned positions (an index past them raises IndexError)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=64, n_positions=n, n_embd=32, n_layer=2, n_head=2)
    cfg.update(dict(bos_token_id=0, eos_token_id=None, pad_token_id=0))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval()


def test_trees_stay_inside_the_position_table_and_answer_as_generate():
    """28 prompt tokens + 4 new on 32 positions: lookup drafts a long chain at every step, which
    used to run past position 31; the decoder on its defaults answers as generate does."""
    model = gpt2_with_positions(32)
    ids = torch.tensor([[5, 6, 7, 8] * 7])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    for cfg in (DecodeConfig(), DecodeConfig(cost_aware=False)):
        gen = SpeculativeGenerator(model, None, None, cfg)
        assert torch.equal(gen.generate(ids, max_new_tokens=4), ref)
    with pytest.raises(UserError, match=r"exceeds the target's 32 positions; use max_new_tokens <= 4") as e:
        gen.generate(ids, max_new_tokens=5)
    assert "\n" not in str(e.value)


def test_cap_depth_pads_nodes_past_the_cap():
    tree = from_rows([([9, 1, 2, 3], [0, 0, 1, 2], [0, 1, 2, 3], [1.0, 0.9, 0.8, 0.7])] * 3, "cpu")
    caps = depth_caps(left=[2, 9, 1], positions=[10, 29, 10], limit=32)
    assert caps == [1, 2, 0]  # tokens left - 1; the position table; no room for drafts
    out = cap_depth(tree, torch.tensor(caps))
    assert out.valid.tolist() == [
        [True, True, False, False],
        [True, True, True, False],
        [True, False, False, False],
    ]
    assert out.parents.tolist() == [[0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert out.depths.tolist() == [[0, 1, 1, 1], [0, 1, 2, 1], [0, 0, 0, 0]]
    assert out.tokens[~out.valid].eq(9).all() and out.scores[~out.valid].eq(0).all()


@pytest.mark.parametrize(
    "rope",
    [
        dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0),
        dict(
            rope_type="longrope",
            short_factor=[1.0] * 4,
            long_factor=[2.0] * 4,
            original_max_position_embeddings=16,
            rope_theta=10000.0,
        ),
    ],
)
def test_rope_scalings_that_switch_on_the_longest_position_are_refused_past_the_switch(rope):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64 if rope["rope_type"] == "longrope" else 16,
        rope_parameters=rope,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    gen = SpeculativeGenerator(model, None, None, DecodeConfig(cost_aware=False))
    ids = torch.tensor([[5, 6, 7, 8] * 2])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert torch.equal(gen.generate(ids, max_new_tokens=8), ref)  # within the switch: as usual
    with pytest.raises(
        UserError, match=f"{rope['rope_type']} RoPE scaling .* keep prompt \\+ max_new_tokens <= 16"
    ):
        gen.generate(ids, max_new_tokens=9)


# ---- the target's generation settings -------------------------------------------------------------
def reference(model, tok, prompt: str, new: int, **kw) -> list[int]:
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, **kw)
    return out[0, ids.shape[1] :].tolist()


def settings_for(kind: str, model, tok) -> dict:
    """Settings that change the plain greedy answers of PROMPTS[:3] (EOS where greedy would stop
    early, held back by min_new_tokens; suppressed tokens greedy would emit)."""
    plain = reference(model, tok, PROMPTS[0], 20)
    if kind == "min_new_tokens":
        return dict(eos_token_id=plain[2], min_new_tokens=12, suppress_tokens=[plain[0]])
    return {
        "repetition_penalty": dict(repetition_penalty=1.3),
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
    }[kind]


@pytest.mark.parametrize("kind", ["repetition_penalty", "no_repeat_ngram_size", "min_new_tokens"])
def test_greedy_honours_penalties_and_length_settings_token_for_token(kind):
    """A left-padded batch with EAGLE-2 trees and lookup branches (whole trees verified) equals
    each row's stock greedy generate under the same settings; as a GenerationConfig too."""
    model, tok = get_target("llama")
    settings = settings_for(kind, model, tok)
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(cost_aware=False))
    prompts = PROMPTS[:3]
    enc = batch(tok, prompts)
    P = enc.input_ids.shape[1]
    outs = [
        gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=20, **settings),
        gen.generate(
            enc.input_ids,
            enc.attention_mask,
            max_new_tokens=20,
            generation_config=GenerationConfig(**settings),
        ),
    ]
    changed = 0
    for i, p in enumerate(prompts):
        ref = reference(model, tok, p, 20, **settings)
        changed += ref != reference(model, tok, p, 20)
        for out in outs:
            assert out[i, P : P + len(ref)].tolist() == ref, (settings, p)
    assert changed  # the settings did something


def test_a_penalty_is_applied_along_each_tree_path():
    """Node 2 sits below a node of token 5: its logit for 5 is penalised, its sibling's is not."""
    model, _ = get_target("llama")
    gc = resolve(model, DecodeConfig(do_sample=False), None, {"repetition_penalty": 2.0})
    proc = Processing(model, gc, [2], max_new=8, device=torch.device("cpu"))
    tokens = torch.tensor([[7, 5, 6, 4]])  # root 7 -> 5 -> 4, root -> 6
    parents = torch.tensor([[0, 0, 0, 1]])
    logits = torch.ones(1, 4, 10)
    out = proc(logits, [0], [[1, 2, 7]], tokens, parents)
    assert out[0, :, 5].tolist() == [1.0, 0.5, 1.0, 0.5]  # nodes 1 (is 5) and 3 (below 5)
    assert out[0, :, 7].tolist() == [0.5] * 4  # the root is in every node's history
    assert out[0, :, 6].tolist() == [1.0, 1.0, 0.5, 1.0]


def first_tokens(model, prompt, **kw):
    """The exact distribution of the first three new tokens given the warpers ``kw`` built by
    hand from transformers' classes: p(x1) p(x2|x1) p(x3|x1,x2)."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList(
        [
            TemperatureLogitsWarper(kw["temperature"]),
            TopKLogitsWarper(kw["top_k"]),
            TopPLogitsWarper(kw["top_p"]),
        ]
    )
    V, P = model.config.vocab_size, prompt.shape[1]
    grid = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    with torch.no_grad():
        lg = model(torch.cat([prompt.expand(V * V, -1), grid], 1)).logits
    p1, p2, p3 = (warpers(None, lg[:, P - 1 + i]).softmax(-1) for i in range(3))
    return p1[0][:, None, None] * p2[torch.arange(V) * V][:, :, None] * p3.reshape(V, V, V)


def test_sampling_follows_the_targets_generation_config_defaults(monkeypatch):
    """A model whose generation config samples (temperature 0.7, top-k 3, top-p 0.9): with no
    sampling argument, the decoder samples from that distribution, as generate does."""
    coarse_curves(monkeypatch)
    model = small_vocab_target()
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.7, top_k=3, top_p=0.9)
    V, N = 6, 4000
    prompt = torch.tensor([[0, 3, 1, 4, 0, 3]])
    exact = first_tokens(model, prompt, temperature=0.7, top_k=3, top_p=0.9)
    d = drafter("eagle", model, fingerprint(model, None), version=1)
    cfg = DecodeConfig(top_k_draft=3, depth=3, total_tokens=6, lookup_tokens=3)
    gen = SpeculativeGenerator(model, d, None, cfg)
    torch.manual_seed(5)
    x = gen.generate(prompt.expand(N, -1), max_new_tokens=3)[:, 6:9]
    freq = torch.zeros(V, V, V)
    freq.index_put_((x[:, 0], x[:, 1], x[:, 2]), torch.ones(N), accumulate=True)
    freq /= N
    tol = 5 * (exact * (1 - exact) / N).sqrt() + 2 / N
    assert ((freq - exact).abs() <= tol).all(), float((freq - exact).abs().max())
    assert max(gen.last_stats.tree_tokens) > 1


def test_sampling_defaults_to_transformers_top_k_50():
    """do_sample=True alone on a model that sets nothing: every draw is among the 50 likeliest
    tokens (of 49152, on a random model whose distribution is nearly flat)."""
    model, tok = get_target("llama")
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        top50 = set(model(ids).logits[0, -1].topk(50).indices.tolist())
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(cost_aware=False))
    torch.manual_seed(0)
    out = gen.generate(ids.expand(64, -1), max_new_tokens=1, do_sample=True)
    assert set(out[:, -1].tolist()) <= top50


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(num_beams=2), "generation mode beam_search"),
        (dict(num_return_sequences=2, do_sample=True), "num_return_sequences=2"),
        (dict(guidance_scale=1.5), "UnbatchedClassifierFreeGuidanceLogitsProcessor cannot be applied"),
        (dict(top_q=0.5), "unknown generation setting"),
    ],
)
def test_settings_the_decoder_cannot_apply_losslessly_are_refused(settings, message):
    model, tok = get_target("llama")
    gen = SpeculativeGenerator(model, None, tok)
    ids = tok("hi", return_tensors="pt").input_ids
    with pytest.raises(UserError, match=message) as e:
        gen.generate(ids, max_new_tokens=4, **settings)
    assert "\n" not in str(e.value)


# ---- seeds ----------------------------------------------------------------------------------------
def test_a_seed_gives_the_same_text_whatever_the_tree():
    """The same seed through a chain, an EAGLE-2 tree with lookup branches, cost-aware pruning
    and plain steps: one text (the draws are indexed by output position, not by tree node)."""
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=1)
    enc = batch(tok, PROMPTS[:3])
    outs = []
    for cfg in (
        DecodeConfig(tree="chain1", dynamic=False, lookup=False, cost_aware=False),
        DecodeConfig(cost_aware=False),
        DecodeConfig(total_tokens=3, depth=2),
    ):
        gen = SpeculativeGenerator(model, d, tok, cfg)
        torch.manual_seed(7)
        outs.append(gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=16, do_sample=True))
        g = torch.Generator().manual_seed(7)
        outs.append(
            gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=16, do_sample=True, generator=g)
        )
    assert all(torch.equal(o, outs[0]) for o in outs)
    torch.manual_seed(8)
    other = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=16, do_sample=True)
    assert not torch.equal(other, outs[0])  # the seed matters


# ---- the context length through the commands ------------------------------------------------------
def test_generate_stops_at_the_targets_context_and_says_so_once(capsys):
    """tiny-llama has 1024 positions: a prompt of about 1000 tokens leaves room for fewer than
    decode.max_new_tokens=64, and the answer stops there."""
    argv = ["generate", "target=tiny-llama", "heads=none", "decode.chat=false", "decode.max_new_tokens=64"]
    assert main([*argv, "prompt=" + "word " * 1000]) == 0
    captured = capsys.readouterr()
    note = [line for line in captured.err.splitlines() if "context of 1024" in line]
    assert len(note) == 1 and "the answer stops at" in note[0]
    room = int(note[0].split("stops at ")[1].split()[0])
    assert 0 < room < 64
    new = int(captured.out.split("\n[")[-1].split()[0])  # "[N tokens in ...s: ..."
    assert 0 < new <= room


def test_eval_refuses_a_prompt_longer_than_the_targets_context(tmp_path, capsys):
    prompts = tmp_path / "long.jsonl"
    rows = [{"id": "short", "prompt": "Hi"}, {"id": "long", "prompt": "word " * 1100}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["eval", "target=tiny-llama", "heads=none", f"eval.prompts={prompts}", "eval.warmup=0"]
    assert main([*argv, f"eval.out_dir={tmp_path / 'eval'}", "decode.max_new_tokens=4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "eval prompt long is" in err[0] and "the target's context is 1024" in err[0]
    assert not (tmp_path / "eval" / "report.json").exists()


def test_typical_acceptance_at_a_low_temperature_follows_greedy():
    """Medusa's typical acceptance on a peaked model at temperature 0.05: every distribution is
    nearly one-hot, so drafts of the argmax are accepted and the draws are the argmax."""
    model = small_vocab_target()
    prompt = torch.tensor([[0, 3, 1, 4, 0, 3]])
    ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    d = drafter("eagle", model, fingerprint(model, None), version=1)
    gen = SpeculativeGenerator(model, d, None, DecodeConfig(cost_aware=False, do_sample=True, typical=True))
    torch.manual_seed(0)
    out = gen.generate(prompt, max_new_tokens=12, temperature=0.05)
    assert torch.equal(out, ref)
    assert gen.last_stats.tau > 1
