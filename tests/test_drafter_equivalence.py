"""Training and decoding compute the same EAGLE drafter.

The decoder runs the drafter incrementally: its own KV cache of accepted (feature, next token)
pairs, compacted per row after each step, plus the tree nodes of the current step. Training
runs it as an unroll (train/unroll.py) over the whole sequence with the target's features and
no cache. Here a recording proposer captures, at every decoding step of a left-padded batch of
two, the drafter's output for the root and for every tree node it fed; each is recomputed with
the training unroll along the node's path over the row's accepted sequence alone, and must
match to 1e-5 (float32). An oracle makes rows accept 0..4 drafts, so compaction is exercised.
Every drafted node must also be a candidate of the unroll's distribution after its parent's
path: in the top ``top_k_draft`` for dynamic trees, at its exact rank for static trees.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.proposers import EagleProposer, Tree
from draftheads.heads import EagleDrafter, fingerprint
from draftheads.heads.features import target_features
from draftheads.train.unroll import unroll
from tests.conftest import get_target
from tests.test_decode import Oracle, reference

ARCH = "llama"
PROMPTS = ["Hi there", "The capital of France is a city that has many"]
NEW = 24
TOL = 1e-5
STATIC4 = "[[0],[1],[0,0],[1,0],[0,1],[0,0,0],[0,0,0,0]]"


@dataclass
class Fed:
    """One drafter pass over tree nodes: their tokens [B, n], fed ancestors (self last) [B, n, F]
    among all nodes fed so far this step, and the drafter's outputs [B, n, H]."""

    tokens: torch.Tensor
    anc: torch.Tensor
    out: torch.Tensor


@dataclass
class Record:
    """One propose call: per active row its input row and accepted sequence (prompt without
    padding, emitted tokens, the root last), the root's drafter output, the fed nodes and the tree."""

    rows: list[int]
    seqs: list[list[int]]
    root_out: torch.Tensor
    fed: list[Fed]
    tree: Tree


class Recorder(EagleProposer):
    """The decoder's EAGLE proposer, unchanged, recording what its drafter computes."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.records: list[Record] = []

    def prefill(self, batch) -> None:
        super().prefill(batch)
        self.rows = list(range(batch.input_ids.shape[0]))
        ids, valid, root = batch.input_ids.tolist(), batch.valid.tolist(), batch.root.tolist()
        self.seqs = [[t for t, v in zip(i, m) if v] + [r] for i, m, r in zip(ids, valid, root)]

    def update(self, step) -> None:
        super().update(step)
        for i, b in enumerate(self.rows):
            self.seqs[b] += step.tokens[i, : step.n_cpu[i]].tolist()

    def select_rows(self, rows: torch.Tensor) -> None:
        super().select_rows(rows)
        self.rows = [self.rows[i] for i in rows.tolist()]

    def propose(self, root, pos, plan=None) -> Tree:
        self.fed: list[Fed] = []
        tree = super().propose(root, pos, plan)
        seqs = [list(self.seqs[b]) for b in self.rows]
        assert [s[-1] for s in seqs] == root.tolist() and [len(s) - 1 for s in seqs] == pos.tolist()
        self.records.append(Record(list(self.rows), seqs, self.root_out.clone(), self.fed, tree))
        return tree

    def _feed_pending(self) -> torch.Tensor:
        self.root_out = super()._feed_pending()
        return self.root_out

    def _feed_tree(self, tokens, hidden, positions, anc_fed) -> torch.Tensor:
        out = super()._feed_tree(tokens, hidden, positions, anc_fed)
        self.fed.append(Fed(tokens.clone(), anc_fed.clone(), out.clone()))
        return out


class RecordingGenerator(SpeculativeGenerator):
    """Decodes with a Recorder inside an Oracle (rows accept a row- and step-dependent depth)."""

    def __init__(self, *a, continuations, prompt_lens, **kw) -> None:
        super().__init__(*a, **kw)
        self.cont, self.plen = continuations, prompt_lens
        self.recorders: list[Recorder] = []

    def make_proposer(self):
        rec = Recorder(self.drafter, self.static, self.config)
        self.recorders.append(rec)
        return Oracle(rec, self.cont, self.plen)


def make_drafter(model, tok, version: int) -> EagleDrafter:
    """A random EAGLE drafter; EAGLE-3 gets a scattered draft vocabulary (draft id != target id)."""
    torch.manual_seed(version)
    fp = fingerprint(model, tok)
    if version == 1:
        return EagleDrafter(fp, target_config=model.config.to_dict(), version=1).attach(model)
    d = EagleDrafter(fp, target_config=model.config.to_dict(), version=3, draft_vocab_size=2000).attach(model)
    d.set_vocab(torch.randperm(fp.vocab_size)[:2000])
    d.init_lm_head_from_target()
    return d


def early_stop(cont: list[list[int]]) -> tuple[int, int]:
    """(token, index) of a token of row 0's continuation, used as EOS, that ends row 0 mid-way
    and never occurs in row 1's, so row 1 goes on alone (the drafter's rows are selected)."""
    for j in range(NEW // 3, NEW // 2):
        t = cont[0][j]
        if t not in cont[0][:j] and t not in cont[1][:NEW]:
            return t, j
    raise AssertionError("no token ends row 0 alone; change the prompts")


def node_path(tokens: torch.Tensor, parents: torch.Tensor, node: int) -> list[int]:
    """Tokens from depth 1 down to ``node`` (empty for the root) in one row's tree."""
    path = []
    while node != 0:
        path.append(int(tokens[node]))
        node = int(parents[node])
    return path[::-1]


class Unroll:
    """The training path for one accepted sequence: the target's features over it (no cache),
    then the drafter's unroll along a drafted path; memoised per path."""

    def __init__(self, model, drafter: EagleDrafter, seq: list[int]) -> None:
        self.drafter, self.seq = drafter, seq
        ids = torch.tensor([seq])
        feats, _ = target_features(model, ids, torch.ones_like(ids), drafter.feature_layers())
        self.feats = feats[:, : len(seq) - 1]  # f_0 .. f_{N-2}: the root's own feature is unknown
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    def out(self, path: list[int]) -> torch.Tensor:
        """The drafter's output [H] after the root and ``path``: step len(path) of the unroll at
        the row of the last real feature. Rows past it (path tokens) get zero features; the
        training masks keep them out of that row."""
        key = tuple(path)
        if key not in self.memo:
            ids = torch.tensor([self.seq + path])
            pad = self.feats.new_zeros(1, len(path), self.feats.shape[-1])
            outs = unroll(self.drafter, torch.cat([self.feats, pad], 1), ids, len(path) + 1)
            self.memo[key] = outs[-1][0, len(self.seq) - 2]
        return self.memo[key]

    def candidates(self, path: list[int], k: int) -> list[int]:
        """Target ids of the k most likely next tokens after ``path``, best first."""
        top = self.drafter.logits(self.out(path)).topk(k).indices
        return self.drafter.draft_to_target(top).tolist()


def fed_paths(fed: list[Fed], row: int) -> list[tuple[list[int], torch.Tensor]]:
    """(path of tokens, decoder output) of every node the drafter fed this step in one row."""
    if not fed:
        return []
    all_tokens = torch.cat([f.tokens[row] for f in fed])
    found = []
    for f in fed:
        for j in range(f.tokens.shape[1]):
            anc = f.anc[row, j]
            found.append((all_tokens[: anc.shape[0]][anc].tolist(), f.out[row, j]))
    return found


def check_record(model, drafter, rec: Record, cfg: DecodeConfig, static_ranks) -> tuple[float, int]:
    """Compare one step's decoder outputs with the unroll; check the tree's candidates.
    Returns (max abs difference, number of outputs compared)."""
    worst, n = 0.0, 0
    for i, seq in enumerate(rec.seqs):
        ref = Unroll(model, drafter, seq)
        for path, got in [([], rec.root_out[i]), *fed_paths(rec.fed, i)]:
            diff = float((got - ref.out(path)).abs().max())
            assert diff <= TOL, (rec.rows[i], seq, path, diff)
            worst, n = max(worst, diff), n + 1
        tokens, parents = rec.tree.tokens[i], rec.tree.parents[i]
        assert int(tokens[0]) == seq[-1]
        for node in range(1, tokens.shape[0]):
            above = node_path(tokens, parents, int(parents[node]))
            if static_ranks is None:
                assert int(tokens[node]) in ref.candidates(above, cfg.top_k_draft), (seq, above, node)
            else:
                rank = int(static_ranks[node])
                assert int(tokens[node]) == ref.candidates(above, rank + 1)[rank], (seq, above, node)
    return worst, n


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("tree", ["chain4", STATIC4, "auto"])
def test_decode_time_drafter_equals_the_training_unroll(version, tree):
    """Every root and fed tree node of every step, in a left-padded batch of two whose rows
    accept 0..4 drafts and where one row leaves early, equals the training unroll to 1e-5."""
    model, tok = get_target(ARCH)
    assert next(model.parameters()).dtype == torch.float32
    decodes_as_it_trains(model, tok, make_drafter(model, tok, version), tree)


def decodes_as_it_trains(model, tok, drafter: EagleDrafter, tree: str) -> None:
    """Decode :data:`PROMPTS` with ``drafter`` and ``tree`` and compare every step's drafter
    outputs with the training unroll (the test above)."""
    cfg = DecodeConfig(
        tree=tree, backend="eager", cost_aware=False, lookup=False, depth=4, top_k_draft=2, total_tokens=12
    )
    cont = [reference(ARCH, p, NEW + 8) for p in PROMPTS]
    plen = [len(tok(p).input_ids) for p in PROMPTS]
    gen = RecordingGenerator(model, drafter, tok, cfg, continuations=cont, prompt_lens=plen)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    assert not bool(enc.attention_mask[0].all())  # the first row really is left-padded
    eos, stop = early_stop(cont)
    out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=NEW, eos_token_id=eos)
    P = enc.input_ids.shape[1]  # the oracle's drafts kept the output the target's own
    assert out[0, P : P + stop + 1].tolist() == cont[0][: stop + 1]
    assert out[1, P:].tolist() == cont[1][:NEW]
    depths = gen.last_stats.accepted_depths
    assert set(depths) == {0, 1, 2, 3, 4}, depths  # rows accepted 0..4 drafts
    assert len(gen.recorders) == 1
    ranks = gen.static.ranks if gen.static is not None else None
    assert (ranks is None) == (tree == "auto")
    records = gen.recorders[0].records
    assert records[0].rows == [0, 1] and records[-1].rows == [1]  # row 0 left the batch
    worst, n = 0.0, 0
    with torch.no_grad():
        for rec in records:
            w, c = check_record(model, drafter, rec, cfg, ranks)
            worst, n = max(worst, w), n + c
    assert n > len(records) * 2  # tree nodes were compared, not only roots
    assert worst <= TOL
