"""Sampling through the speculative decoder keeps the target's exact distribution: every drafter
kind, static and dynamic trees, lookup branches and cost-aware pruning, on a tiny-vocabulary target
whose trigram frequencies are counted against the exact ones."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.proposers import Tree
from draftheads.heads import MedusaHeads, fingerprint
from tests.test_decode import Oracle, coarse_curves, drafter


def small_vocab_target(vocab: int = 6, layers: int = 2):
    """A tiny Llama over a 6-token vocabulary with peaked distributions (so drafts get accepted)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(3)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(60)
    return model


class TopTokens(Oracle):
    """Drafts the target's two likeliest tokens after (prompt, root), then the likeliest after
    the first: informative and still a deterministic function of the prefix, as the proof needs."""

    def __init__(self, inner, model, prompt) -> None:
        self.inner, self.model, self.prompt = inner, model, prompt

    def propose(self, root, pos, plan=None) -> Tree:
        tree = self.inner.propose(root, pos)
        seq = torch.cat([self.prompt.expand(len(root), -1), root[:, None]], 1)
        top2 = self.model(seq).logits[:, -1].topk(2).indices
        after = self.model(torch.cat([seq, top2[:, :1]], 1)).logits[:, -1].argmax(-1)
        tokens = torch.stack([root, top2[:, 0], top2[:, 1], after], 1)
        return Tree(tokens, tree.parents, tree.depths, tree.scores, tree.valid)


class TopTokensGenerator(SpeculativeGenerator):
    prompt: torch.Tensor

    def make_proposer(self):
        return TopTokens(super().make_proposer(), self.target, self.prompt)


# drafters of the 2-layer 6-token target (a DFlash block of 3 holds the static tree's two levels;
# P-EAGLE reads three target layers, so its target has three, and its group of 3 holds the tree)
SMALL = {
    "medusa": dict(num_heads=2),
    "eagle": dict(version=1),
    "dflash": dict(mask_token_id=5, block_size=3, feature_layers=[1]),
    "peagle": dict(mask_token_id=5, num_depths=3, feature_layers=[1, 2, 3]),
}
SMALL_LAYERS = {"peagle": 3}


def assert_trigram_frequencies(x: torch.Tensor, exact: torch.Tensor) -> None:
    """The first three sampled tokens of ``x [N, 3]`` follow ``exact [V, V, V]``: every trigram's
    frequency within five standard errors (plus 2/N) of its probability."""
    N, V = x.shape[0], exact.shape[0]
    freq = torch.zeros(V, V, V)
    freq.index_put_((x[:, 0], x[:, 1], x[:, 2]), torch.ones(N), accumulate=True)
    freq /= N
    tol = 5 * (exact * (1 - exact) / N).sqrt() + 2 / N
    assert ((freq - exact).abs() <= tol).all(), float((freq - exact).abs().max())


@pytest.mark.parametrize("kind", ["medusa", "eagle", "dflash", "peagle"])
def test_sampling_matches_the_targets_exact_distribution(kind):
    """Joint distribution of the first three new tokens (1 from the prefill, 2 from the first
    tree step) over 4000 rows vs the exact product of the target's warped conditionals."""
    model = small_vocab_target(layers=SMALL_LAYERS.get(kind, 2))
    V, N = 6, 4000
    fp = fingerprint(model, None)
    d = (
        MedusaHeads(fp, **SMALL[kind]).attach(model)
        if kind == "medusa"
        else drafter(kind, model, fp, **SMALL[kind])
    )
    warp_kw = dict(temperature=0.9, top_k=4, top_p=0.95)
    prompt = torch.tensor([[0, 3, 1, 4]])
    # exact: p(x1) p(x2|x1) p(x3|x1,x2), from every 2-token continuation at once
    from draftheads.decode.verify import warp

    grid = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    seqs = torch.cat([prompt.expand(V * V, -1), grid], 1)
    with torch.no_grad():
        lg = model(seqs).logits
    p1 = warp(lg[0, 3], **warp_kw)
    p2 = warp(lg[:, 4], **warp_kw)  # row r = (x1, x2): p(x2 | x1) at index x1*V (any x2)
    p3 = warp(lg[:, 5], **warp_kw)
    exact = p1[:, None, None] * p2[torch.arange(V) * V][:, :, None] * p3.reshape(V, V, V)
    gen = TopTokensGenerator(
        model, d, None, DecodeConfig(tree="[[0],[1],[0,0]]", dynamic=False, cost_aware=False, lookup=False)
    )
    gen.prompt = prompt
    torch.manual_seed(11)
    out = gen.generate(prompt.expand(N, -1), max_new_tokens=3, do_sample=True, **warp_kw)
    x = out[:, 4:7]
    freq = torch.zeros(V, V, V)
    freq.index_put_((x[:, 0], x[:, 1], x[:, 2]), torch.ones(N), accumulate=True)
    freq /= N
    tol = 5 * (exact * (1 - exact) / N).sqrt() + 2 / N
    assert ((freq - exact).abs() <= tol).all(), float((freq - exact).abs().max())
    # the tree step accepted drafts (up to the 2 tokens that were left), not just residual samples
    assert gen.last_stats.tau > 1.3


@pytest.mark.parametrize("kind", ["eagle", "dflash", "peagle"])
def test_sampling_distribution_with_dynamic_trees_lookup_and_cost_aware_pruning(kind, monkeypatch):
    """The same exact-distribution check through the default machinery: an EAGLE-2 dynamic
    tree (DDTree for DFlash) from a real drafter, a lookup branch merged into it, and cost-aware
    pruning (on a coarsely measured curve)."""
    coarse_curves(monkeypatch)
    model = small_vocab_target(layers=SMALL_LAYERS.get(kind, 2))
    V, N = 6, 4000
    d = drafter(kind, model, fingerprint(model, None), **SMALL[kind])
    warp_kw = dict(temperature=0.9, top_k=4, top_p=0.95)
    prompt = torch.tensor([[0, 3, 1, 4, 0, 3]])  # "0 3" repeats: lookup has something to propose
    from draftheads.decode.verify import warp

    grid = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    seqs = torch.cat([prompt.expand(V * V, -1), grid], 1)
    with torch.no_grad():
        lg = model(seqs).logits
    P = prompt.shape[1]
    p1 = warp(lg[0, P - 1], **warp_kw)
    p2 = warp(lg[:, P], **warp_kw)
    p3 = warp(lg[:, P + 1], **warp_kw)
    exact = p1[:, None, None] * p2[torch.arange(V) * V][:, :, None] * p3.reshape(V, V, V)
    cfg = DecodeConfig(top_k_draft=3, depth=3, total_tokens=6, lookup=True, cost_aware=True, lookup_tokens=3)
    gen = SpeculativeGenerator(model, d, None, cfg)
    torch.manual_seed(5)
    out = gen.generate(prompt.expand(N, -1), max_new_tokens=3, do_sample=True, **warp_kw)
    assert_trigram_frequencies(out[:, P : P + 3], exact)
    assert max(gen.last_stats.tree_tokens) > 1  # drafts were verified, not only plain steps


# ---- devices, dtypes and user errors ---------------------------------------------------------------
