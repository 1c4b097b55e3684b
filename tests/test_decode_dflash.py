"""DFlash block drafters in the decoder: tree building, the cached context, lossless output, commands."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from draftheads.conf.cli import main
from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, block_tree
from draftheads.decode.proposers import DFlashProposer
from draftheads.decode.proposers.base import single_node
from draftheads.decode.tree import tree_from_choices
from draftheads.heads import Drafter, fingerprint
from draftheads.heads.dflash import DFlashDrafter, choose_mask_token
from tests.conftest import get_target
from tests.test_decode import PROMPTS, Oracle, OracleGenerator, check_rows, reference

BLOCK = 6


def dflash(kind: str = "llama", block: int = BLOCK, **kw) -> DFlashDrafter:
    """A random-initialised DFlash drafter for ``tiny-<kind>``, attached."""
    model, tok = get_target(kind)
    torch.manual_seed(0)
    d = DFlashDrafter(
        fingerprint(model, tok), model.config.to_dict(), choose_mask_token(tok), block_size=block, **kw
    )
    return d.attach(model)


# ---- trees from one block's per-position candidates -----------------------------------------------
def lattice_paths(values: torch.Tensor, depth: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every path of 1..depth ranks over ``values [D, k]`` with its Σ log q, best first."""
    D, k = values.shape
    out = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            out.append((sum(float(values[j, r]) for j, r in enumerate(ranks)), ranks))
    return sorted(out, key=lambda x: -x[0])


def test_best_first_keeps_the_n_likeliest_paths_of_the_lattice():
    """DDTree equals brute force: the n best paths over every position's top-k, closed under parents."""
    torch.manual_seed(0)
    B, D, k = 3, 4, 3
    values = torch.randn(B, D, 8).log_softmax(-1).topk(k, dim=-1).values
    ids = torch.arange(D * k).reshape(1, D, k).expand(B, D, k) + 100  # token = 100 + d*k + rank
    root = torch.tensor([7, 8, 9])
    for n, depth in ((1, 4), (5, 4), (9, 3), (200, 2)):
        tokens, parents, depths, scores = block_tree.best_first(root, values, ids, n, depth)
        for b in range(B):
            paths = []
            for i in range(1, tokens.shape[1]):
                ranks, j = [], i
                while j:
                    ranks.append(int(tokens[b, j]) - 100 - (int(depths[b, j]) - 1) * k)
                    assert parents[b, j] < j  # parents precede children
                    j = int(parents[b, j])
                paths.append(tuple(reversed(ranks)))
                assert len(paths[-1]) == depths[b, i]
            best = lattice_paths(values[b], depth)[:n]
            assert set(paths) == {p for _, p in best}
            want = {p: s for s, p in best}
            for p, s in zip(paths, scores[b, 1:].tolist()):
                assert s == pytest.approx(want[p], abs=1e-5)
            assert tokens[b, 0] == root[b] and scores[b, 0] == 0


def test_static_tree_takes_each_depths_ranked_candidate_and_multiplies_marginals():
    values = torch.tensor([[[-0.1, -2.0], [-0.5, -1.0], [-0.2, -3.0]]])  # [1, D=3, k=2]
    ids = torch.tensor([[[10, 11], [20, 21], [30, 31]]])
    st = tree_from_choices([[0], [1], [0, 0], [1, 1], [0, 0, 0]])
    tokens, scores = block_tree.static_tree(torch.tensor([5]), values, ids, st)
    assert tokens.tolist() == [[5, 10, 11, 20, 21, 30]]
    assert scores[0].tolist() == pytest.approx([0, -0.1, -2.0, -0.6, -3.0, -0.8])


# ---- the context cache: equal to a pass over the whole context, step after step ------------------
def scratch_log_q(model, d: DFlashDrafter, history: list[int], root: int, drafts: int) -> torch.Tensor:
    """The block's log q from scratch: the target over the row's whole text, the drafter's context
    keys/values for every position, one block pass at the next position."""
    ids = torch.tensor([history])
    feats = d.select_features(model(ids, output_hidden_states=True).hidden_states)
    context = d.context_kv(feats, torch.arange(len(history))[None])
    block = d.block_inputs(torch.tensor([root]))
    T = block.shape[1]
    out = d(
        block, len(history) + torch.arange(T)[None], context, torch.ones(1, 1, T, len(history) + T).bool()
    )
    return d.logits(out[:, 1 : 1 + drafts]).float().log_softmax(-1)[0]


class CheckedOracle(Oracle):
    """The oracle (rows accept different lengths, rows finish apart) that also checks, before
    every draft, the proposer's cached block pass against one from scratch and its cache's rows."""

    def __init__(self, inner, continuations, prompt_lens, model, drafter, skip: bool) -> None:
        super().__init__(inner, continuations, prompt_lens)
        self.model, self.drafter, self.checked, self.skip = model, drafter, 0, skip

    def prefill(self, batch):
        super().prefill(batch)
        rows = zip(batch.input_ids.tolist(), batch.valid.tolist())
        self.history = [[t for t, v in zip(r, m) if v] for r, m in rows]
        self.roots = batch.root.tolist()

    def update(self, step):
        super().update(step)
        for i, b in enumerate(self.rows):
            emitted = step.tokens[i, : step.n_cpu[i]].tolist()
            self.history[b] += [self.roots[b], *emitted[:-1]]
            self.roots[b] = emitted[-1]

    def propose(self, root, pos, plan=None):
        if self.skip and self.step % 2:  # the decoder verifies this step without drafting
            self.step += 1
            return single_node(root)
        p: DFlashProposer = self.inner
        log_q = p.block_log_q(root, pos, p.drafts)
        assert p.valid.sum(1).tolist() == [len(self.history[b]) for b in self.rows]  # accepted only
        assert p.valid.shape[1] == p.cache.get_seq_length() == max(p.lengths_cpu)
        for i, b in enumerate(self.rows):
            assert root[i] == self.roots[b] and pos[i] == len(self.history[b])
            ref = scratch_log_q(self.model, self.drafter, self.history[b], self.roots[b], p.drafts)
            assert torch.allclose(log_q[i], ref, atol=1e-4, rtol=1e-4)
        self.checked += 1
        return super().propose(root, pos, plan)


class CheckedGenerator(OracleGenerator):
    def make_proposer(self):
        inner = SpeculativeGenerator.make_proposer(self)
        self.checked = CheckedOracle(inner, self.cont, self.plen, self.target, self.drafter, self.skip)
        return self.checked

    @property
    def proposer_checks(self) -> int:
        return self.checked.checked


@pytest.mark.parametrize("skip", [False, True])
def test_cached_context_block_pass_equals_a_pass_over_the_whole_context(skip):
    """Through DDTree steps (an accepted path is not a run of consecutive nodes), left padding,
    rows that accept different lengths, rows that finish apart and (``skip``) every other step
    verified without drafting."""
    arch = "llama"
    model, tok = get_target(arch)
    prompts = PROMPTS[1:4]  # different lengths: left padding
    cont = [reference(arch, p, 24) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    cfg = DecodeConfig(cost_aware=False, lookup=False, top_k_draft=2, total_tokens=8, backend="eager")
    gen = CheckedGenerator(model, dflash(arch), tok, cfg, continuations=cont, prompt_lens=plen)
    gen.skip = skip
    check_rows(arch, gen, prompts, new=24)
    stats = gen.last_stats
    assert gen.proposer_checks > 3 and stats.tau > 1.3
    assert len(set(stats.accepted_lengths)) >= 3  # rows accept different lengths


# ---- lossless: greedy output is the target's ------------------------------------------------------
SETTINGS = [(True, True, "onednn"), (False, False, "eager")]  # (cost_aware, lookup, backend)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tree", ["auto", "chain"])
def test_greedy_output_is_the_targets(arch, tree):
    model, tok = get_target(arch)
    d = dflash(arch, draft_vocab_size=2000 if arch == "qwen2" else None)
    for cost_aware, lookup, backend in SETTINGS:
        cfg = DecodeConfig(tree=tree, cost_aware=cost_aware, lookup=lookup, backend=backend)
        gen = SpeculativeGenerator(model, d, tok, cfg)
        for prompts in (PROMPTS[:1], PROMPTS[1:4]):  # one row; a left-padded batch of three
            check_rows(arch, gen, prompts, new=16)
            assert gen.last_stats.new_tokens == len(prompts) * 16


@pytest.mark.parametrize("tree", ["auto", "chain", "[[0],[1],[0,0],[0,1],[0,0,0]]"])
def test_oracle_drafts_are_accepted_through_chain_static_and_ddtree(tree):
    arch = "qwen2"
    model, tok = get_target(arch)
    prompts = PROMPTS[:4]
    cont = [reference(arch, p, 40) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    cfg = DecodeConfig(tree=tree, cost_aware=False, lookup=False, top_k_draft=3, total_tokens=10)
    gen = OracleGenerator(model, dflash(arch), tok, cfg, continuations=cont, prompt_lens=plen)
    check_rows(arch, gen, prompts, new=40)
    stats = gen.last_stats
    assert stats.tau > 1.5 and len(set(stats.accepted_lengths)) >= 3
    if tree != "auto":  # the oracle's branch is the tree's deepest: the block's, or the static tree's
        assert len(stats.per_position_acceptance) == (3 if tree.startswith("[") else BLOCK - 1)


def test_one_pass_per_step_and_the_tree_stops_at_the_tokens_left():
    model, tok = get_target("llama")
    d = dflash()
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(tree="chain", lookup=False, cost_aware=False))
    calls = []
    d.register_forward_hook(lambda *a: calls.append(1))
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids
    gen.generate(ids, max_new_tokens=4)  # 3 tokens after the prefill's: the chain of 5 is cut to 2
    stats = gen.last_stats
    assert len(calls) == stats.steps  # one pass of the whole block a step
    assert stats.tree_tokens[0] == 3  # the root and the 2 drafts left: the cut nodes are not verified
    assert stats.new_tokens == 4 and max(stats.accepted_depths) <= 2


# ---- bad input -------------------------------------------------------------------------------------
def test_a_tree_deeper_than_the_block_is_refused_in_one_line():
    model, tok = get_target("llama")
    d = dflash()
    for spec in ("chain9", "[[0],[0,0],[0,0,0],[0,0,0,0],[0,0,0,0,0],[0,0,0,0,0,0]]"):
        with pytest.raises(UserError, match="block of 6 drafts 5") as e:
            SpeculativeGenerator(model, d, tok, DecodeConfig(tree=spec))
        assert "\n" not in str(e.value)
    assert SpeculativeGenerator(model, d, tok, DecodeConfig(tree="chain")).static.depth == BLOCK - 1


def test_a_checkpoint_for_another_target_or_with_layers_it_lacks_is_refused(tmp_path):
    model, tok = get_target("llama")
    dflash().save_pretrained(tmp_path)
    other, other_tok = get_target("qwen2")
    with pytest.raises(UserError):
        Drafter.from_pretrained(tmp_path, target=other, tokenizer=other_tok)
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["spec"]["feature_layers"] = [1, 2, 9]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(UserError, match="9") as e:
        Drafter.from_pretrained(tmp_path, target=model, tokenizer=tok)
    assert "\n" not in str(e.value)


# ---- the commands ----------------------------------------------------------------------------------
def test_generate_eval_and_speed_take_a_dflash_checkpoint(tmp_path, capsys):
    heads = tmp_path / "dflash"
    dflash(draft_vocab_size=2000).save_pretrained(heads)
    base = ["target=tiny-llama", f"heads={heads}", "decode.max_new_tokens=8"]
    assert main(["generate", *base, "prompt=Hi there"]) == 0
    assert "tau" in capsys.readouterr().out
    out = tmp_path / "eval"
    assert main(["eval", *base, "eval.max_prompts=2", f"eval.out_dir={out}", "eval.warmup=0"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert (
        rep["drafter"] == "dflash" and rep["greedy_identical"] == 1.0 and rep["draft_cost_greedy_steps"] > 0
    )
    assert main(["speed", *base, "speed.batch_sizes=[1,2]", "speed.prompts=2"]) == 0
    printed = capsys.readouterr().out
    assert "draft cost (greedy steps)" in printed
    rows = [line.split("|") for line in printed.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2 and all(r[-3].strip() == "True" and float(r[-4]) > 0 for r in rows)
