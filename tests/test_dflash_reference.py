"""z-lab's reference DFlash (the ``dflash`` package) as an oracle: a drafter its
``DFlashDraftModel`` saves imports here with equal block logits, and its model loads draftheads'
vLLM export with nothing missing and equal logits. Skipped, with the reason, without ``dflash``."""

from __future__ import annotations

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


def test_a_drafter_saved_by_zlabs_model_imports_with_equal_block_logits(tmp_path, tiny_llama):
    from transformers import Qwen3Config

    model, tok, fp = tiny_llama
    cls = reference_class()
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
    zlab = cls(config)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in zlab.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    zlab.eval().save_pretrained(str(tmp_path / "zlab"))
    ours = Drafter.from_pretrained(tmp_path / "zlab", target=model, tokenizer=tok).eval()
    assert ours.feature_layers() == LAYERS and ours.block_size == BLOCK and ours.num_decoder_layers == 2
    assert torch.allclose(block_logits(ours, model), reference_logits(zlab, model), atol=1e-5)


def test_zlabs_model_loads_our_vllm_export_with_equal_block_logits(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    cls = reference_class()
    d = dflash(model, fp)
    out = export_drafter(d, "vllm", tmp_path / "vllm")
    zlab, info = cls.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert zlab.target_layer_ids == [i - 1 for i in LAYERS] and zlab.block_size == BLOCK
    assert torch.allclose(reference_logits(zlab.eval(), model), block_logits(d, model), atol=1e-5)
