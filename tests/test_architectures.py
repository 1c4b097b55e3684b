"""The architecture matrix, row by row: every draft config on a tiny random target of every tested
architecture trains, decodes greedy-identically with a chain and a tree, and exports in every
format its kind offers (:mod:`draftheads.bench.architectures`).

Each test runs one architecture's row and checks it against ``docs/architectures.md``, which the
matrix wrote: the page cannot claim what the code does not do. EAGLE-3 must be ✔ on every
architecture, and an architecture outside the matrix works or is refused in one line.
"""

from __future__ import annotations

import pytest

from draftheads.bench import architectures as matrix
from draftheads.conf.errors import UserError

PAGE = matrix.cells_of(matrix.DOC.read_text())


@pytest.mark.parametrize("arch", matrix.architectures())
def test_each_row_is_what_the_page_says(arch, tmp_path):
    cells = matrix.row(arch, tmp_path)
    got = {(c.arch, c.draft): matrix.mark(c) for c in cells}
    want = {k: v for k, v in PAGE.items() if k[0] == arch}
    assert got == want, {c.draft: c.notes for c in cells}
    eagle3 = next(c for c in cells if c.draft == "eagle3")
    assert eagle3.all_ok, eagle3.notes
    assert all(c.formats.get("vllm") != matrix.FAIL for c in cells)


def test_the_page_covers_every_architecture_and_draft_config():
    assert {a for a, _ in PAGE} == set(matrix.architectures())
    assert {d for _, d in PAGE} == set(matrix.draft_groups())


def test_a_sliding_window_is_what_keeps_the_decoder_identical(tmp_path, monkeypatch):
    """The matrix can fail: the same decode with every layer's window dropped from the mask
    differs from the target's own output on a windowed architecture."""
    from draftheads.heads import Drafter, masks

    target, tok = matrix.tiny_target("gemma3_text")
    assert matrix.run_cell("gemma3_text", "eagle3", tmp_path).chain == matrix.OK
    drafter = Drafter.from_pretrained(tmp_path / "gemma3_text-eagle3" / "train", target=target, tokenizer=tok)
    monkeypatch.setattr(masks, "kind_allowed", lambda config, kind, allowed, q, k: allowed)  # no windows
    assert not matrix.greedy_identical(target, tok, drafter, "chain2")


def test_an_encoder_decoder_target_is_refused_in_one_line_before_anything_is_written(tmp_path):
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads.target.load import load_target

    config = AutoConfig.for_model(
        "t5", vocab_size=64, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16
    )
    AutoModelForSeq2SeqLM.from_config(config).save_pretrained(tmp_path / "t5")
    matrix.tiny_target("llama")[1].save_pretrained(tmp_path / "t5")
    before = sorted(p.name for p in (tmp_path / "t5").iterdir())
    with pytest.raises(UserError, match="t5.*encoder-decoder.*decoder-only causal LM") as e:
        load_target(TargetConfig(name_or_path=str(tmp_path / "t5"), device="cpu", dtype="float32"))
    assert "\n" not in str(e.value) and sorted(p.name for p in (tmp_path / "t5").iterdir()) == before


HYBRID = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
OUTSIDE = {  # decoder-only families the matrix does not list: fused qkv, parallel residual, windows,
    # and recurrent layers (Qwen3-Next's gated delta rule with experts, LFM2's short convolutions)
    "gpt_neox": dict(intermediate_size=128),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2),
    "starcoder2": dict(intermediate_size=128, num_key_value_heads=2, sliding_window=8),
    "qwen3_next": dict(
        intermediate_size=128,
        num_key_value_heads=2,
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=HYBRID,
    ),
    "lfm2": dict(intermediate_size=128, num_key_value_heads=2, layer_types=["conv", "full_attention"] * 2),
}


@pytest.mark.parametrize("arch", sorted(OUTSIDE))
def test_an_architecture_outside_the_matrix_decodes_identically_and_exports(arch, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftheads.heads import EagleDrafter, fingerprint
    from draftheads.heads.export import export_drafter

    _, tok = matrix.tiny_target("llama")
    config = AutoConfig.for_model(
        arch, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, vocab_size=len(tok), **OUTSIDE[arch]
    )
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(config).eval()
    target.config._attn_implementation = "sdpa"
    drafter = EagleDrafter(
        fingerprint(target, tok), target_config=config.to_dict(), version=3, draft_vocab_size=500
    )
    drafter.attach(target).init_lm_head_from_target()
    for tree in ("chain2", "auto"):
        assert matrix.greedy_identical(target, tok, drafter, tree), tree
    export_drafter(drafter, "vllm", tmp_path / "vllm")  # validated against vLLM's loader rules


def test_a_recurrent_target_rolls_its_state_back_to_the_last_accepted_draft():
    """Qwen3.5's linear-attention layers read each verified chain in order; an oracle makes a
    row-dependent number of drafts right, so steps accept 0 to 4 of them and the state is rolled
    back by the rest: the output stays the target's own."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.heads import fingerprint
    from tests.conftest import get_target
    from tests.test_decode import OracleGenerator, drafter, reference

    arch = "qwen3_5_text"
    model, tok = get_target(arch)
    cfg = DecodeConfig(tree="chain4", cost_aware=False, backend="eager", lookup=False)
    lengths = []
    for prompt in ("Hello, my name is", "1 2 3 4 5 6 7 8 9 10 11"):
        cont, ids = reference(arch, prompt, 30), tok(prompt, return_tensors="pt").input_ids
        gen = OracleGenerator(
            model,
            drafter("eagle", model, fingerprint(model, tok), version=3, draft_vocab_size=2000),
            tok,
            cfg,
            continuations=[cont],
            prompt_lens=[ids.shape[1]],
        )
        out = gen.generate(ids, max_new_tokens=30)
        assert out[0, ids.shape[1] :].tolist() == cont
        lengths += gen.last_stats.accepted_lengths
    assert {1, 2, 3, 4, 5} <= set(lengths)  # every number of drafts accepted, and all rejected


def test_a_recurrent_target_decodes_one_row_at_a_time():
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator

    model, tok = matrix.tiny_target("qwen3_5_text")
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(backend="eager", cost_aware=False))
    enc = tok(["a b", "c d e"], return_tensors="pt", padding=True, padding_side="left")
    with pytest.raises(UserError, match="linear_attention layers.*one call each") as e:
        gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=4)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arch", ["mistral", "gemma3_text", "llama4_text", "qwen3_5_text"])
def test_the_plain_batched_loop_keeps_each_targets_windows_and_states(arch):
    """The project's plain loop (the speed baseline, distillation's generator), left-padded rows
    past the 8-token windows and chunks, equals the target's own generate row by row."""
    import torch

    from draftheads.decode.batched import generate_retiring

    model, tok = matrix.tiny_target(arch)
    enc = tok(list(matrix.PROMPTS), return_tensors="pt", padding=True, padding_side="left")
    out = generate_retiring(model, enc.input_ids, enc.attention_mask, max_new_tokens=matrix.NEW_TOKENS)
    width = enc.input_ids.shape[1]
    for i, prompt in enumerate(matrix.PROMPTS):
        want = matrix.reference(model, tok, prompt)
        assert out[i, width : width + len(want)].tolist() == want, prompt
    assert torch.equal(out[:, :width], enc.input_ids)


def test_packed_training_rows_give_each_document_the_features_it_has_alone():
    """Packed rows (several documents, positions restarting at 0) on windowed layers: each
    document's features equal its own forward's, past the 8-token window."""
    import torch

    from draftheads.heads.features import target_features

    model, _ = matrix.tiny_target("gemma3_text")
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(10, 1000, (n,), generator=g) for n in (14, 11)]
    packed = torch.cat(docs)[None]
    position_ids = torch.cat([torch.arange(len(d)) for d in docs])[None]
    layers = [1, 2, 4]
    f, _ = target_features(model, packed, None, layers, position_ids=position_ids)
    start = 0
    for d in docs:
        alone, _ = target_features(model, d[None], torch.ones_like(d)[None], layers)
        torch.testing.assert_close(f[:, start : start + len(d)], alone, rtol=1e-4, atol=1e-5)
        start += len(d)


def test_a_target_folder_without_sdpa_runs_eager_said_in_one_line(tmp_path, capsys):
    """transformers refuses sdpa for a saved GPT-OSS (its attention sinks): the target loads
    with eager attention instead, and one line says so and names the key."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.conf.schema.tiny import TINY_CONFIGS
    from draftheads.heads.target.load import load_target

    _, tok = matrix.tiny_target("llama")
    spec = {k: v for k, v in TINY_CONFIGS["gpt_oss"].items() if k != "model_type"}
    AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gpt_oss", vocab_size=len(tok), **spec)
    ).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, _ = load_target(TargetConfig(name_or_path=str(tmp_path), device="cpu", dtype="float32"))
    assert model.config._attn_implementation == "eager"
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("target:")]
    assert len(said) == 1 and "target.attn_implementation=eager" in said[0]
