"""Grouped-query attention under a tree mask without copying keys: the same attention as
transformers' SDPA path, switched on only inside the decoder's backend blocks."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from draftheads.decode import backend as backends
from draftheads.decode.attention import NAME, grouped, grouped_sdpa
from draftheads.heads.masks import additive_mask


def tree_case(B: int = 2, H: int = 6, kv: int = 2, n: int = 5, S: int = 14, seed: int = 0):
    """Random query/key/value and a mask where each new token sees a random set of cached slots
    and of the new tokens before it (a tree), plus itself."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, 8, generator=g)
    k, v = torch.randn(B, kv, S, 8, generator=g), torch.randn(B, kv, S, 8, generator=g)
    allowed = torch.rand(B, n, S, generator=g) < 0.6
    own = torch.arange(S - n, S)
    allowed[:, torch.arange(n), own] = True
    allowed[:, :, S - n :] &= torch.ones(n, n, dtype=torch.bool).tril()
    return q, k, v, additive_mask(allowed, torch.float32)


@pytest.mark.parametrize("kv", [1, 2, 3, 6])
def test_grouped_sdpa_is_transformers_sdpa_under_a_tree_mask(kv: int) -> None:
    q, k, v, mask = tree_case(kv=kv)
    module = torch.nn.Module().eval()
    module.num_key_value_groups = q.shape[1] // kv
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    got, _ = grouped_sdpa(module, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (q.shape[0], q.shape[2], q.shape[1], q.shape[3])
    assert torch.allclose(got, want, atol=1e-6)


def test_grouped_sdpa_without_a_mask_is_the_causal_call() -> None:
    q, k, v, _ = tree_case(n=1)
    module = torch.nn.Module().eval()
    module.num_key_value_groups = 3
    want, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.5)
    got, _ = grouped_sdpa(module, q, k, v, None, scaling=0.5)
    assert torch.equal(got, want)


def test_grouped_block_switches_and_restores_the_implementation(tiny_llama) -> None:
    model = tiny_llama[0]
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    allowed = torch.ones(9, 9, dtype=torch.bool).tril()
    allowed[6, 3:6] = False  # a branch: token 6 skips 3-5
    mask = additive_mask(allowed[None], torch.float32)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        with grouped(model):
            assert model.config._attn_implementation == NAME
            with grouped(model):  # nested blocks keep it until the outer one ends
                pass
            assert model.config._attn_implementation == NAME
            got = model(input_ids=ids, attention_mask=mask).logits
    assert model.config._attn_implementation == "sdpa"
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(RuntimeError), grouped(model):
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"


def test_every_backend_block_runs_grouped_attention(tiny_llama) -> None:
    model = tiny_llama[0]
    for name in ("eager", "onednn"):
        with backends.applied(name, model):
            assert model.config._attn_implementation == NAME
        assert model.config._attn_implementation == "sdpa"


def test_a_block_reads_each_configs_implementation_when_it_is_entered(tiny_llama) -> None:
    """A model's attention configs are found once, but whether each is SDPA is read at every
    block: a model switched to eager attention between two blocks is left as it is."""
    from draftheads.decode.attention import head_configs

    model = tiny_llama[0]
    with grouped(model):
        pass
    assert head_configs(model) is head_configs(model) and model.config in head_configs(model)
    model.config._attn_implementation = "eager"
    try:
        with grouped(model):
            assert model.config._attn_implementation == "eager"
    finally:
        model.config._attn_implementation = "sdpa"
    with grouped(model):
        assert model.config._attn_implementation == NAME


def test_a_prompt_read_whole_takes_sdpas_causal_call_and_a_padded_one_keeps_its_mask(tiny_llama) -> None:
    from draftheads.decode.attention import plain_causal

    model = tiny_llama[0]
    n = 9
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    causal = additive_mask(allowed[None], torch.float32)[:, None]
    padded = allowed.clone()
    padded[1:, 0] = False  # a left-padded row: its first slot is padding
    assert plain_causal(causal, n, n) and plain_causal(allowed[None, None], n, n)
    assert not plain_causal(additive_mask(padded[None], torch.float32)[:, None], n, n)
    assert not plain_causal(causal[..., :4, :], 4, n)  # queries after cached keys: a step, not a prompt
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(2))
    mask = additive_mask(allowed[None], torch.float32)  # as the decoder's prefill passes it
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        with grouped(model):
            got = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(got, want, atol=1e-5)
