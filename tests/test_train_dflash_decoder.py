"""DFlash training sees what decoding sees: on three documents, padded and packed, online and
from a feature cache, the objective's features, block passes and block labels equal the decoder's
view of each document alone, at every candidate anchor."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.schema.heads import DraftConfig
from draftheads.data.cache.build import build_feature_cache
from draftheads.data.cache.read import FeatureCache
from draftheads.decode.static import hidden_request
from draftheads.heads import DFlashDrafter, fingerprint
from draftheads.train.batching import collate, collate_packed, micro_batch
from draftheads.train.modules import DFlashObjective
from draftheads.train.modules.dflash_blocks import anchor_candidates, block_targets, chunked_anchors
from tests.conftest import get_target
from tests.test_decode_dflash import BLOCK, dflash, scratch_log_q


def consistency_docs() -> list[dict]:
    """Three documents of different lengths: a few prompt tokens, then answer tokens."""
    g = torch.Generator().manual_seed(3)
    docs = []
    for n, prompt in ((13, 4), (9, 2), (11, 5)):
        ids = torch.randint(100, 2000, (n,), generator=g).tolist()
        docs.append({"input_ids": ids, "loss_mask": [0] * prompt + [1] * (n - prompt)})
    return docs


@pytest.fixture(scope="module")
def consistency(tmp_path_factory):
    """(target, drafter, objective, batches): the documents padded and packed, online and read from
    a feature cache (EAGLE-3's layers with the final state, so DFlash reads a subset, and the
    target's top-8 as soft labels)."""
    model, tok = get_target("llama")
    d = dflash("llama")
    obj = DFlashObjective(d, model, DraftConfig.of(kind="dflash", block_size=BLOCK), topk=5)
    docs = consistency_docs()
    directory = tmp_path_factory.mktemp("dflash-consistency")
    columns = {k: [r[k] for r in docs] for k in ("input_ids", "loss_mask")}
    build_feature_cache(model, tok, columns, directory, [1, 2, 3, 4], "float32", topk=8, show_progress=False)
    cache = FeatureCache(directory, fingerprint(model, tok), d.feature_layers(), subset=True)
    cached = [cache[i] for i in range(len(docs))]
    batches = {
        ("padded", "online"): collate(docs, 0),
        ("packed", "online"): collate_packed(docs),
        ("padded", "cached"): collate(cached, 0),
        ("packed", "cached"): micro_batch(cached, 0, pack=True),
    }
    return model, d, obj, docs, batches


LAYOUTS = [(layout, source) for layout in ("padded", "packed") for source in ("online", "cached")]


def spans(batch: dict) -> list[tuple[int, int, int]]:
    """``(row, start, end)`` of every document of a batch, in order: one per padded row, one per
    run of positions counted from 0 in a packed row."""
    out = []
    for b, valid in enumerate(batch["attention_mask"].bool()):
        n = int(valid.sum())
        pos = batch["position_ids"][b, :n] if "position_ids" in batch else torch.arange(n)
        starts = (pos == 0).nonzero().flatten().tolist() + [n]
        out += [(b, s, e) for s, e in zip(starts, starts[1:])]
    return out


def decoder_view(model, d: DFlashDrafter, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One document alone as the decoder reads it: ``(select_features [n, F], target logits [n, V])``,
    the target asked for the drafter's layers only (``hidden_request``), as the decoder asks."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=hidden_request(tuple(d.feature_layers())))
    return d.select_features(out.hidden_states)[0], out.logits[0].float()


def every_anchor(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Every candidate anchor of the batch, in one pass: ``(anchors [B, N], keep [B, N])``."""
    candidates = anchor_candidates(batch["loss_mask"], batch.get("position_ids"))
    (anchors, keep), *rest = chunked_anchors(candidates, 64)
    assert not rest and keep.sum() > 10
    return anchors, keep


def doc_start(batch: dict, b: int, a: int) -> int:
    """The batch column where the document holding column ``a`` of row ``b`` starts."""
    return a - int(batch["position_ids"][b, a]) if "position_ids" in batch else 0


@pytest.mark.parametrize("layout,source", LAYOUTS)
def test_training_features_are_the_decoders_select_features(consistency, layout, source):
    """Online (the target on padded rows, or on packed rows under the block-diagonal mask) and
    cached (a subset of a cache's layers) features are the decoder's ``select_features`` of each
    document alone, position by position."""
    model, d, obj, docs, batches = consistency
    batch = batches[layout, source]
    feats = obj.features(batch)
    assert len(spans(batch)) == len(docs)
    for (b, start, end), doc in zip(spans(batch), docs):
        want, _ = decoder_view(model, d, doc["input_ids"])
        assert end - start == len(doc["input_ids"])
        torch.testing.assert_close(feats[b, start:end], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout,source", LAYOUTS)
def test_training_blocks_are_the_decoders_block_pass(consistency, layout, source):
    """The block the objective drafts at anchor a is the decoder's block pass after it accepted
    exactly the document's tokens before a, with root x_a (``scratch_log_q``, which the decoder's
    cached pass equals): every block position's log q, at every candidate anchor."""
    model, d, obj, _, batches = consistency
    batch = batches[layout, source]
    anchors, keep = every_anchor(batch)
    h = obj.draft(batch, obj.context(obj.features(batch), batch.get("position_ids")), anchors, keep)
    log_q = d.logits(h[..., 1:, :]).float().log_softmax(-1)
    ids = batch["input_ids"]
    for b, n in keep.nonzero().tolist():
        a = int(anchors[b, n])
        history = ids[b, doc_start(batch, b, a) : a].tolist()
        want = scratch_log_q(model, d, history, int(ids[b, a]), BLOCK - 1)
        torch.testing.assert_close(log_q[b, n], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout,source", LAYOUTS)
def test_block_labels_are_the_targets_next_token_at_a_plus_k_minus_1(consistency, layout, source):
    """Block position k of the block at a is labelled with the target's next-token distribution at
    a+k-1 of the document alone: from a cache, its top-8 ids and logits (the soft label) and the
    top-1 the reference token; online, the greedy token evaluation compares against (training's
    hard label is the data's x_{a+k}). Either way the top-1 is the token greedy decoding emits
    at a+k after the document's tokens before it."""
    model, d, obj, _, batches = consistency
    batch = batches[layout, source]
    pos = batch.get("position_ids")
    anchors, keep = every_anchor(batch)
    source_at, counted = block_targets(anchors, keep, BLOCK, batch["loss_mask"], pos)
    _, greedy = obj.features_and_greedy(batch)
    data_next = obj.next_tokens(batch) if source == "online" else None
    ids = batch["input_ids"]
    views = {(b, s): decoder_view(model, d, ids[b, s:e].tolist())[1] for b, s, e in spans(batch)}
    checked = 0
    for b, n, k in counted.nonzero().tolist():
        a, src = int(anchors[b, n]), int(source_at[b, n, k])
        start = doc_start(batch, b, a)
        assert src == a + k - 1
        target = views[b, start][src - start]  # the target's next-token distribution after x_{..a+k-1}
        assert greedy[b, src] == target.argmax()
        if source == "cached":
            top = target.topk(8)
            assert batch["topk_ids"][b, src].tolist() == top.indices.tolist()
            torch.testing.assert_close(batch["topk_logits"][b, src].float(), top.values, atol=1e-4, rtol=1e-4)
            assert obj.next_tokens(batch)[b, src] == target.argmax()
        else:
            assert data_next[b, src] == ids[b, a + k]
        checked += 1
    assert checked == int(counted.sum()) > 20
