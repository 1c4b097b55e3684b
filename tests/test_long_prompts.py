"""The long-context prompt sets (1-2k tokens over standard-library source and reference text)
and the planner's cost curve at such contexts: read for the call's context, decoding greedy."""

from __future__ import annotations

import torch

from draftheads.conf.schema.decode import DecodeConfig, EvalConfig
from draftheads.data.prompts import load_prompts
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.cost import context_bucket
from draftheads.decode.prompting import encode_prompt
from tests.conftest import get_target


def test_the_long_set_has_1k_to_2k_token_prompts_over_standard_library_source():
    _, tok = get_target("llama")  # the tiny targets use SmolLM2's tokenizer
    rows = load_prompts("long", tokenizer=tok)
    assert len(rows) == 16 and {r.category for r in rows} == {"summarise", "explain"}
    assert len({r.id for r in rows}) == 16 and all(len(r.turns) == 1 for r in rows)
    lengths = [encode_prompt(tok, r.turns[0]).shape[1] for r in rows]
    assert all(950 <= n <= 2200 for n in lengths), lengths
    assert {context_bucket(n) for n in lengths} == {1024, 2048}
    assert all("```python" in r.turns[0] and f"`{r.id.split('/')[1]}`" in r.turns[0] for r in rows)
    assert sum("def " in r.turns[0] or "class " in r.turns[0] for r in rows) >= 12  # code, not only prose
    assert load_prompts("long", tokenizer=tok) == rows  # a fixed order and text
    assert EvalConfig(prompts="long").prompts == "long"


def test_the_copy_set_asks_for_answers_that_copy_from_1k_to_2k_token_prompts():
    _, tok = get_target("llama")
    rows = load_prompts("copy", tokenizer=tok)
    assert len(rows) == 16 and len({r.id for r in rows}) == 16
    cats = [r.category for r in rows]
    assert {c: cats.count(c) for c in set(cats)} == {"summarise": 4, "quote": 4, "rename": 4, "annotate": 4}
    lengths = [encode_prompt(tok, r.turns[0]).shape[1] for r in rows]
    assert all(800 <= n <= 2200 for n in lengths), lengths
    for r in rows:
        if r.category == "rename":  # the function to rename is defined in the code given
            name = r.turns[0].split("`")[1]
            assert f"def {name}(" in r.turns[0] and "return the whole updated code" in r.turns[0]
        if r.category in ("summarise", "quote"):
            assert "Python language reference" in r.turns[0]
    assert load_prompts("copy", tokenizer=tok) == rows  # a fixed order and text
    assert EvalConfig(prompts="copy").prompts == "copy"


def test_a_2k_token_prompt_plans_on_its_context_and_keeps_greedy_output():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 1900))
    ids[0, -40:] = ids[0, 100:140]  # something for lookup to copy
    gen = SpeculativeGenerator(model, None, None, DecodeConfig(lookup=True))
    out = gen.generate(ids, max_new_tokens=16, do_sample=False)
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    assert torch.equal(out[0, 1900:], ref[0, 1900:])
    assert gen.cost_curve(1, 1900).key["context"] == 1900
    assert gen.cost_curve(1, 1900)(4) >= gen.cost_curve(1, 100)(4)  # attention over more cached tokens
