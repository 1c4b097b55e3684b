"""z-lab's reference DFlash (the ``dflash`` package) as an oracle: a drafter its
``DFlashDraftModel`` saves imports here with equal block logits, and its model loads draftheads'
vLLM export with nothing missing and equal logits, and its generate loop accepts the same
lengths as our decoder step for step on the same drafter. Skipped, with the reason, without ``dflash``."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from draftheads.heads import Drafter
from draftheads.heads.export import export_drafter
from tests.test_dflash_formats import BLOCK, LAYERS, MASK, block_logits, dflash

CONTEXT = 9  # block_logits' setup: 9 context positions, then a block at positions 9..12


def reference_class():
    """z-lab's ``DFlashDraftModel``, or a skip naming what is missing."""
    pytest.importorskip("dflash", reason="dflash is not installed (see the interop extra in pyproject.toml)")
    from dflash import DFlashDraftModel

    return DFlashDraftModel


@torch.no_grad()
def reference_logits(zlab, model) -> torch.Tensor:
    """z-lab's block logits on :func:`block_logits`' setup, through its own forward and helpers."""
    from dflash import extract_context_feature

    ids = torch.arange(3, 3 + CONTEXT)[None] * 7 % 200
    hidden = model(ids, output_hidden_states=True).hidden_states
    block = torch.tensor([[int(ids[0, -1])] + [zlab.mask_token_id] * (zlab.block_size - 1)])
    out = zlab(
        position_ids=torch.arange(CONTEXT + zlab.block_size)[None],
        noise_embedding=model.get_input_embeddings()(block),
        target_hidden=extract_context_feature(hidden, zlab.target_layer_ids),
    )
    return zlab.compute_logits(out, model.lm_head)


def zlab_drafter(model, fp, seed: int = 2):
    """A two-layer z-lab ``DFlashDraftModel`` for ``model``, its weights perturbed (norms included)."""
    from transformers import Qwen3Config

    tc = model.config.to_dict()
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
    config = Qwen3Config(
        **{k: tc[k] for k in keys},
        head_dim=tc["head_dim"],
        num_hidden_layers=2,
        num_target_layers=fp.num_layers,
        block_size=BLOCK,
        dflash_config={"mask_token_id": MASK, "target_layer_ids": [i - 1 for i in LAYERS]},
        architectures=["DFlashDraftModel"],
    )
    with torch.random.fork_rng():  # its own initialisation draws from the global generator
        torch.manual_seed(seed)
        zlab = reference_class()(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in zlab.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return zlab.eval()


def test_a_drafter_saved_by_zlabs_model_imports_with_equal_block_logits(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    zlab = zlab_drafter(model, fp)
    zlab.save_pretrained(str(tmp_path / "zlab"))
    ours = Drafter.from_pretrained(tmp_path / "zlab", target=model, tokenizer=tok).eval()
    assert ours.feature_layers() == LAYERS and ours.block_size == BLOCK and ours.num_decoder_layers == 2
    assert torch.allclose(block_logits(ours, model), reference_logits(zlab, model), atol=1e-5)


def few_token_target(model, tokens: int = 3):
    """A copy of ``model`` whose head ranks a few tokens far above the rest (one random
    direction of the final hidden state each): target and drafter, which reads the target's
    head, then agree often, so blocks are accepted in part and the acceptance lengths vary."""
    target = copy.deepcopy(model).eval()
    head = target.get_output_embeddings().weight
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        head.mul_(0.01)
        for k in range(tokens):
            head[11 + k] = 4 * torch.randn(head.shape[1], generator=g)
    return target


def test_zlabs_generate_loop_and_our_decoder_accept_the_same_lengths_step_for_step(
    tmp_path, tiny_llama, monkeypatch
):
    """On one drafter, z-lab's greedy ``dflash_generate`` and our decoder (the block's argmax
    chain, no lookup, no cost-aware pruning) emit the same tokens in the same steps."""
    import dflash.model as zmodel

    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator

    model, tok, fp = tiny_llama
    target = few_token_target(model)
    zlab = zlab_drafter(target, fp, seed=3)
    zlab.save_pretrained(str(tmp_path / "zlab"))
    ours = Drafter.from_pretrained(tmp_path / "zlab", target=target, tokenizer=tok).eval()
    monkeypatch.setattr(zmodel, "_cuda_time", time.perf_counter)  # its stats path times with CUDA
    cfg = DecodeConfig(tree="chain", cost_aware=False, lookup=False)
    gen = SpeculativeGenerator(target, ours, tok, cfg)
    seen = []
    for seed, new in ((1, 24), (2, 24)):
        prompt = torch.randint(20, 200, (1, 7), generator=torch.Generator().manual_seed(seed))
        ref = zmodel.dflash_generate(zlab, target, prompt, new, None, return_stats=True)
        out = gen.generate(prompt, max_new_tokens=new)
        assert torch.equal(out, ref.output_ids)
        steps = gen.last_stats.accepted_lengths
        assert steps == ref.acceptance_lengths, (steps, ref.acceptance_lengths)
        seen += steps
    assert max(seen) == BLOCK and min(seen) == 1  # drafts accepted, several in a row, and rejected


def test_zlabs_model_loads_our_vllm_export_with_equal_block_logits(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    d = dflash(model, fp)
    out = export_drafter(d, "vllm", tmp_path / "vllm")
    zlab, info = reference_class().from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert zlab.target_layer_ids == [i - 1 for i in LAYERS] and zlab.block_size == BLOCK
    assert torch.allclose(reference_logits(zlab.eval(), model), block_logits(d, model), atol=1e-5)
