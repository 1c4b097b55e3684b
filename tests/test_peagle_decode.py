"""P-EAGLE drafters in the decoder: built through the proposer registry, lossless greedy output
through a chain, a static tree and DDTree (one drafter pass a step), drafts accepted along each
tree (an oracle makes them right), and a tree deeper than the trained group refused in one line."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.proposers import PEagleProposer, build_proposer
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import PROMPTS, OracleGenerator, check_rows, reference
from tests.test_peagle_draft import K, peagle

TREES = ["auto", "chain4", "[[0],[1],[0,0],[0,1],[0,0,0]]"]  # DDTree, the whole group, a static tree
SETTINGS = [(True, True, "onednn"), (False, False, "eager")]  # (cost_aware, lookup, backend)


def drafter(arch: str = "llama"):
    model, tok = get_target(arch)
    return model, tok, peagle(model, fingerprint(model, tok), seed=1)


def test_the_registry_builds_the_peagle_proposer_for_its_drafter():
    _, _, d = drafter()
    proposer = build_proposer(d, None, DecodeConfig(lookup=False))
    assert isinstance(proposer, PEagleProposer) and proposer.drafts == K


@pytest.mark.parametrize("tree", TREES)
def test_greedy_output_is_the_targets(tree):
    model, tok, d = drafter()
    calls = []
    d.register_forward_hook(lambda *a: calls.append(1))
    for cost_aware, lookup, backend in SETTINGS:
        cfg = DecodeConfig(tree=tree, cost_aware=cost_aware, lookup=lookup, backend=backend)
        gen = SpeculativeGenerator(model, d, tok, cfg)
        for prompts in (PROMPTS[:1], PROMPTS[1:4]):  # one row; a left-padded batch of three
            calls.clear()
            check_rows("llama", gen, prompts, new=12)
            assert gen.last_stats.new_tokens == len(prompts) * 12
            passes = len(calls)  # one group pass a step, whatever the tree (cost-aware: where drafts pay)
            assert passes == gen.last_stats.steps if not cost_aware else passes <= gen.last_stats.steps


@pytest.mark.parametrize("tree", TREES)
def test_oracle_drafts_are_accepted_through_chain_static_and_ddtree(tree):
    arch = "llama"
    model, tok, d = drafter(arch)
    prompts = PROMPTS[:3]
    cont = [reference(arch, p, 30) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    cfg = DecodeConfig(tree=tree, cost_aware=False, lookup=False, top_k_draft=3, total_tokens=10)
    gen = OracleGenerator(model, d, tok, cfg, continuations=cont, prompt_lens=plen)
    check_rows(arch, gen, prompts, new=30)
    stats = gen.last_stats
    assert stats.tau > 1.5 and len(set(stats.accepted_lengths)) >= 3


def test_a_tree_deeper_than_the_group_is_refused_in_one_line():
    model, tok, d = drafter()
    for spec in (f"chain{K + 1}", "[[0],[0,0],[0,0,0],[0,0,0,0],[0,0,0,0,0]]"):
        with pytest.raises(UserError, match=f"the P-EAGLE drafter was trained for groups of {K}") as e:
            SpeculativeGenerator(model, d, tok, DecodeConfig(tree=spec)).generate(
                tok(PROMPTS[0], return_tensors="pt").input_ids, max_new_tokens=2
            )
        assert "\n" not in str(e.value) and f"decode.tree=chain{K}" in str(e.value)
    assert torch.is_tensor(d.mask_hidden)
