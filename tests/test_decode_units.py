"""Pure tensor pieces of the decoder: tree buffers, tree search, dynamic trees, verification, KV."""

from __future__ import annotations

import math

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.decode import dynamic, kv
from draftheads.decode.tree import (
    ancestor_mask,
    best_tree,
    chain,
    expected_tokens,
    parse_tree,
    path_nodes,
    tree_from_choices,
)
from draftheads.decode.verify import greedy_accept, sample_accept, warp

CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_tree_buffers_from_choices():
    t = tree_from_choices([[0, 0, 0], [1], [0], [0, 1], [1, 0], [0, 0]])  # any order in
    assert t.choices == tuple(map(tuple, CHOICES))
    assert t.parents.tolist() == [0, 0, 0, 1, 1, 2, 3]
    assert t.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert t.ranks.tolist() == [0, 0, 1, 0, 1, 0, 0]
    assert t.size == 7 and t.depth == 3 and t.topk_per_depth() == [2, 2, 1]
    anc = ancestor_mask(t.parents, t.depth)
    assert anc[6].nonzero()[:, 0].tolist() == [0, 1, 3, 6]  # [0,0,0] <- [0,0] <- [0] <- root
    assert anc[5].nonzero()[:, 0].tolist() == [0, 2, 5]
    assert anc[0].nonzero()[:, 0].tolist() == [0]
    # batched paths, left-aligned and padded with the end node
    best = torch.tensor([6, 2, 0])
    assert path_nodes(anc.expand(3, 7, 7), best, 4).tolist() == [[0, 1, 3, 6], [0, 2, 2, 2], [0, 0, 0, 0]]


@pytest.mark.parametrize(
    "choices,heads,match",
    [
        ([[0], [0, 0], [0, 0, 0]], 2, "has depth 3 but the drafter has 2 heads"),
        ([[0], [1, 0]], 4, r"no parent \[1\]"),
        ([[0], [0]], 4, "twice"),
        ([], 4, "empty"),
        ([[0], [-1]], 4, "ranks >= 0"),
        ("x", 4, "not a list of rank paths"),
    ],
)
def test_tree_validation_is_one_line(choices, heads, match):
    with pytest.raises(UserError, match=match) as e:
        tree_from_choices(choices, heads)
    assert "\n" not in str(e.value)


def test_parse_tree_specs(tmp_path):
    assert parse_tree("auto", 4) is None
    assert parse_tree("chain", 3) == chain(3) == [[0], [0, 0], [0, 0, 0]]
    assert parse_tree("chain2", 3) == [[0], [0, 0]]
    assert parse_tree("[[0],[1]]", 3) == [[0], [1]]
    (tmp_path / "tree.json").write_text('{"choices": [[0], [0, 0]]}')
    assert parse_tree(str(tmp_path / "tree.json"), 3) == [[0], [0, 0]]
    with pytest.raises(UserError, match="no such file"):
        parse_tree("nope.json", 3)
    with pytest.raises(UserError, match="not valid JSON"):
        parse_tree("[[0]", 3)


def test_best_tree_maximises_expected_tokens():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.1, 0.05], [0.4, 0.1, 0.0]]
    tree = best_tree(acc, 4)
    assert tree == [[0], [1], [0, 0], [0, 0, 0]]  # 0.6, 0.2, 0.3, 0.12 beat [2]=0.1 and [0,1]=0.06
    tree_from_choices(tree, 3)  # closed under parents
    # exhaustive check over every 4-node tree drawn from the 3x3x3 paths
    import itertools

    paths = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    best = max(
        expected_tokens(acc, [list(p) for p in sub])
        for sub in itertools.combinations(paths, 4)
        if all(len(p) == 1 or p[:-1] in sub for p in sub)
    )
    assert expected_tokens(acc, tree) == pytest.approx(best)
    assert expected_tokens(acc, tree) == pytest.approx(1 + 0.6 + 0.2 + 0.3 + 0.12)


def test_dynamic_children_and_rerank_keep_parents():
    # two levels by hand: level 1 = 2 candidates, level 2 = 2x2 children
    logp1 = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    top = logp1.topk(2)
    scores = [top.values]
    ids = [top.indices]
    parents = [torch.tensor([[-1, -1]])]
    depths = [torch.tensor([[1, 1]])]
    logp2 = torch.log(torch.tensor([[[0.9, 0.05, 0.05], [0.5, 0.4, 0.1]]]))
    c_scores, c_ids, slot = dynamic.children(logp2, scores[0], 2)
    torch.testing.assert_close(c_scores.exp(), torch.tensor([[0.54, 0.03, 0.15, 0.12]]))
    assert slot.tolist() == [[0, 0, 1, 1]] and c_ids.tolist() == [[0, 1, 0, 1]]
    assert dynamic.frontier(c_scores, 2).tolist() == [[0, 2]]
    scores.append(c_scores)
    ids.append(c_ids)
    parents.append(torch.tensor([[0, 1]]).gather(1, slot))
    depths.append(torch.full_like(c_ids, 2))
    tokens, tparents, tdepths, _ = dynamic.rerank(
        torch.tensor([7]),
        torch.cat(scores, 1),
        torch.cat(ids, 1),
        torch.cat(parents, 1),
        torch.cat(depths, 1),
        4,
    )
    # best 4 of {0.6, 0.3, 0.54, 0.03, 0.15, 0.12}: 0.6 (a), 0.54 (a->0), 0.3 (b), 0.15 (b->0)
    assert tokens.tolist() == [[7, 0, 1, 0, 0]]
    assert tparents.tolist() == [[0, 0, 0, 1, 2]]
    assert tdepths.tolist() == [[0, 1, 1, 2, 2]]


def test_rerank_ties_never_orphan_a_child():
    # a child with log q = 0 ties its parent; the stable sort must still pick the parent first
    scores = torch.tensor([[-1.0, -2.0, -1.0]])
    parents = torch.tensor([[-1, -1, 0]])
    tokens, tparents, _, _ = dynamic.rerank(
        torch.tensor([9]), scores, torch.tensor([[4, 5, 6]]), parents, torch.tensor([[1, 1, 2]]), 2
    )
    assert tokens.tolist() == [[9, 4, 6]] and tparents.tolist() == [[0, 0, 1]]


def test_greedy_accept_longest_matching_path():
    t = tree_from_choices(CHOICES)
    anc = ancestor_mask(t.parents, t.depth)[None]
    V = 10
    # target argmax after each node: root->3, node1->4, node2->5, node3->6, ...
    pred = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    logits = torch.nn.functional.one_hot(pred, V).float()
    # node1 = 3 (matches root), node3 ([0,0]) = 4 (matches node1), node6 ([0,0,0]) = 1 (wrong)
    tokens = torch.tensor([[0, 3, 2, 4, 9, 1, 1]])
    best, bonus = greedy_accept(logits, tokens, t.parents[None], t.depths[None], anc)
    assert best.tolist() == [3] and bonus.tolist() == [6]
    tokens[0, 6] = 6
    best, bonus = greedy_accept(logits, tokens, t.parents[None], t.depths[None], anc)
    assert best.tolist() == [6] and bonus.tolist() == [9]
    tokens[0, 1] = 0  # first draft wrong: only the root, bonus = argmax at root
    best, bonus = greedy_accept(logits, tokens, t.parents[None], t.depths[None], anc)
    assert best.tolist() == [0] and bonus.tolist() == [3]


def test_warp_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    x = torch.randn(3, 50) * 3
    ref = x.clone()
    for w in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)):
        ref = w(None, ref)
    torch.testing.assert_close(warp(x, 0.7, 20, 0.8), ref.softmax(-1))


def test_tree_rejection_sampling_preserves_a_synthetic_distribution():
    """A 2-level tree over a 5-token vocabulary; exact p(x1, x2) vs 40k samples of the first two
    emitted tokens (when the step stops at the root, x2 is drawn from the exact conditional,
    which is what the next step does)."""
    torch.manual_seed(0)
    V, N = 5, 40_000
    t = tree_from_choices([[0], [1], [0, 0], [1, 0], [1, 1]])  # nodes: 1=a, 2=b, 3=a->c, 4=b->d, 5=b->e
    p_root = torch.tensor([0.35, 0.25, 0.2, 0.15, 0.05])
    cond = torch.softmax(torch.randn(V, V) * 1.5, -1)  # p(x2 | x1)
    c, (d, e) = int(cond[1].argmax()), cond[3].topk(2).indices.tolist()  # likely drafts at depth 2
    tokens = torch.tensor([0, 1, 3, c, d, e])  # the root's token is irrelevant here
    node_probs = torch.stack([p_root, cond[1], cond[3], cond[c], cond[d], cond[e]])
    anc = ancestor_mask(t.parents, 2).expand(N, -1, -1)
    best, bonus = sample_accept(
        node_probs[None].expand(N, -1, -1),
        tokens.expand(N, -1),
        t.parents.expand(N, -1),
        t.depths.expand(N, -1),
        anc,
        torch.rand(N, t.size),
    )
    depth = t.depths[best]
    path = path_nodes(anc, best, 3)
    emitted = torch.cat([tokens[path[:, 1:]], bonus[:, None]], 1)  # drafts on the path, then the bonus
    emitted.scatter_(1, depth[:, None], bonus[:, None])
    x1 = emitted[:, 0]
    x2 = torch.where(depth >= 1, emitted[:, 1], torch.multinomial(cond[x1], 1)[:, 0])
    freq = torch.zeros(V, V)
    freq.index_put_((x1, x2), torch.ones(N), accumulate=True)
    freq /= N
    exact = p_root[:, None] * cond
    tol = 5 * (exact * (1 - exact) / N).sqrt() + 1 / N
    assert ((freq - exact).abs() <= tol).all(), (freq - exact).abs().max()
    # the tree was used: both depth-1 drafts and a depth-2 draft got accepted often
    assert (depth == 2).float().mean() > 0.05 and (depth == 1).float().mean() > 0.1


def test_kv_compaction_keeps_each_rows_path():
    from transformers import DynamicCache

    B, H, S, T, D, L = 2, 2, 4, 5, 3, 3
    cache = DynamicCache()
    for layer in range(L):
        k = torch.arange(B * H * (S + T) * D, dtype=torch.float32).reshape(B, H, S + T, D) + 1000 * layer
        cache.update(k, -k, layer)
    before = [(la.keys.clone(), la.values.clone()) for la in cache.layers]
    lengths = torch.tensor([4, 2])  # row 1 has two garbage slots (2, 3) at its end
    path = torch.tensor([[0, 1, 3], [0, 2, 2]])  # row 0 keeps 3 tree nodes, row 1 keeps 2
    n_keep = [3, 2]
    new_len = max(a + n for a, n in zip(lengths.tolist(), n_keep))
    kv.compact(cache, S + path, lengths[:, None] + torch.arange(3), new_len)
    assert kv.seq_length(cache) == 7
    for (k0, v0), la in zip(before, cache.layers):
        for b in range(B):
            L_b, n = lengths[b].item(), n_keep[b]
            torch.testing.assert_close(la.keys[b, :, :L_b], k0[b, :, :L_b])  # prefix untouched
            torch.testing.assert_close(la.keys[b, :, L_b : L_b + n], k0[b, :, S + path[b, :n]])
            torch.testing.assert_close(la.values[b, :, L_b : L_b + n], v0[b, :, S + path[b, :n]])
    kv.truncate(cache, 5)
    kv.select_rows(cache, torch.tensor([1]))
    assert cache.layers[0].keys.shape == (1, H, 5, D)


def test_tolerance_formula_is_sane():
    # guard against a vacuous statistical test: the tolerance at p=0.1 with 40k samples is < 1%
    assert 5 * math.sqrt(0.1 * 0.9 / 40_000) + 1 / 40_000 < 0.01


def test_pending_pairs_merged_at_once_equal_them_merged_step_by_step():
    """The pairs of steps verified without drafting, queued and merged once when the drafter reads
    them, are those a merge after every step gives: each row's kept pairs in order, then the rest."""
    from draftheads.decode.proposers.eagle import merge_pending

    g = torch.Generator().manual_seed(0)

    def batch(width: int) -> tuple:
        n_keep = torch.randint(1, width + 1, (3,), generator=g)
        j = torch.arange(width)[None]
        return (
            torch.randn(3, width, 4, generator=g),
            torch.randint(0, 50, (3, width), generator=g),
            j < n_keep[:, None],
            torch.randint(0, 99, (3, width), generator=g),
            n_keep,
            n_keep.tolist(),
        )

    a, b, c, d = batch(7), batch(3), batch(1), batch(4)
    once = merge_pending(a, b, c, d)
    stepwise = merge_pending(merge_pending(merge_pending(a, b), c), d)
    for x, y in zip(once[:5], stepwise[:5]):
        assert torch.equal(x, y)
    assert once[5] == stepwise[5] == (a[4] + b[4] + c[4] + d[4]).tolist()
    # each row: the kept pairs of a, b, c, d in that order come first
    for r in range(3):
        kept = [t[r, : int(t_keep[r])].tolist() for _, t, _, _, t_keep, _ in (a, b, c, d)]
        assert once[1][r, : once[4][r]].tolist() == [x for k in kept for x in k]
