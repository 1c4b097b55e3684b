"""P-EAGLE's proposer through the proposer protocol (prefill, propose, update, select_rows) on the
tiny Llama target: after a prompt and after steps that accept different lengths per row, each
step's chain is the argmax of a group drafted from scratch over the row's whole accepted text
(so its cache of pairs stays right), a DDTree is built from the group's top-k as DFlash's block's
is, and a tree deeper than the trained group is refused in one line."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.proposers.base import Accepted, Prefill
from draftheads.decode.proposers.peagle import PEagleProposer
from draftheads.decode.tree import chain, tree_from_choices
from draftheads.heads.peagle import parallel_draft
from tests.test_peagle_draft import K, peagle


@torch.no_grad()
def reference_log_q(d, model, text: list[int]) -> torch.Tensor:
    """log q of the group after ``text`` (its last token the root), from scratch: ``[K, V_draft]``."""
    ids = torch.tensor([text])
    hidden = model(ids, output_hidden_states=True).hidden_states
    n = len(text) - 1
    feats = d.select_features(hidden)[:, :n]
    out = parallel_draft(d, feats, ids[:, 1:], torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool), K)
    return d.logits(out)[0].float().log_softmax(-1)


@torch.no_grad()
def prefill(proposer, model, prompts: torch.Tensor) -> list[list[int]]:
    """Read the prompts; the roots are the target's greedy next tokens. Returns each row's text."""
    out = model(prompts, output_hidden_states=True)
    root = out.logits[:, -1].argmax(-1)
    B, P = prompts.shape
    proposer.prefill(
        Prefill(
            out.hidden_states, prompts, torch.ones(B, P, dtype=torch.bool), torch.arange(P).expand(B, P), root
        )
    )
    return [row + [int(r)] for row, r in zip(prompts.tolist(), root)]


@torch.no_grad()
def accept(proposer, model, texts: list[list[int]], trees, keep: list[int]) -> list[list[int]]:
    """Verify each row's chain on its own (the target's states at the chain's nodes) and accept
    ``keep[b]`` drafts, then a bonus token (the target's greedy one after them)."""
    nodes, tokens, hidden = [], [], []
    for b, text in enumerate(texts):
        drafts = trees.tokens[b, 1:].tolist()
        seq = torch.tensor([text + drafts])
        out = model(seq, output_hidden_states=True)
        at = len(text) - 1  # the root's position
        hidden.append([h[0, at:] for h in out.hidden_states])
        bonus = int(out.logits[0, at + keep[b]].argmax())
        tokens.append(drafts[: keep[b]] + [bonus])
        nodes.append(list(range(keep[b] + 1)))
    A = max(map(len, nodes))
    path = torch.tensor([n + [0] * (A - len(n)) for n in nodes])
    toks = torch.tensor([t + [0] * (A - len(t)) for t in tokens])
    states = tuple(torch.stack([h[i] for h in hidden]) for i in range(len(hidden[0])))
    n_keep = [len(n) for n in nodes]
    pos = torch.tensor([len(t) - 1 for t in texts])
    proposer.update(Accepted(states, path, toks, torch.tensor(n_keep), n_keep, pos))
    return [text + t for text, t in zip(texts, tokens)]


def test_each_chain_is_the_group_drafted_from_scratch_over_the_accepted_text(tiny_llama):
    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=8)
    proposer = PEagleProposer(d, tree_from_choices(chain(K)).to("cpu"), DecodeConfig())
    prompts = torch.tensor([[21, 34, 55, 89, 144, 233], [30, 40, 50, 60, 70, 80]])
    texts = prefill(proposer, model, prompts)
    for keep in ([0, 2], [K, 1], [3, 0]):
        tree = proposer.propose(
            torch.tensor([t[-1] for t in texts]), torch.tensor([len(t) - 1 for t in texts])
        )
        for b, text in enumerate(texts):
            want = reference_log_q(d, model, text)
            drafted = d.draft_to_target(want.argmax(-1))
            assert tree.tokens[b].tolist() == [text[-1]] + drafted.tolist()
            assert torch.allclose(tree.scores[b, 1:].log(), want.max(-1).values.cumsum(0), atol=1e-4)
        texts = accept(proposer, model, texts, tree, keep)
    proposer.select_rows(torch.tensor([1]))  # row 0 finished; row 1 drafts on
    tree = proposer.propose(torch.tensor([texts[1][-1]]), torch.tensor([len(texts[1]) - 1]))
    assert (
        tree.tokens[0, 1:].tolist()
        == d.draft_to_target(reference_log_q(d, model, texts[1]).argmax(-1)).tolist()
    )


def test_ddtree_is_built_from_the_groups_top_k_as_dflashs_block_is(tiny_llama):
    from draftheads.decode import block_tree

    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=9)
    proposer = PEagleProposer(d, None, DecodeConfig(top_k_draft=3, total_tokens=9))
    texts = prefill(proposer, model, torch.tensor([[21, 34, 55, 89, 144, 233]]))
    tree = proposer.propose(torch.tensor([texts[0][-1]]), torch.tensor([len(texts[0]) - 1]))
    top = reference_log_q(d, model, texts[0])[None].topk(3, dim=-1)
    root = torch.tensor([texts[0][-1]])
    tokens, parents, depths, log_scores = block_tree.best_first(
        root, top.values, d.draft_to_target(top.indices), 8, K
    )
    assert tree.tokens.shape == (1, 9) and proposer.passes == 1 and int(tree.depths.max()) > 1
    assert (
        torch.equal(tree.tokens, tokens)
        and torch.equal(tree.parents, parents)
        and torch.equal(tree.depths, depths)
    )
    assert torch.allclose(tree.scores, log_scores.exp(), atol=1e-5)


def test_a_tree_deeper_than_the_trained_group_is_refused_in_one_line(tiny_llama):
    model, _, fp = tiny_llama
    d = peagle(model, fp)
    with pytest.raises(UserError, match=f"drafts {K + 1} tokens deep but the P-EAGLE drafter") as err:
        PEagleProposer(d, tree_from_choices(chain(K + 1)), DecodeConfig())
    assert "\n" not in str(err.value)
