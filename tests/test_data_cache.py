"""Offline feature cache: same tensors as the online path, sharded, resumable, and strict on reading."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DataConfig
from draftheads.data.cache.build import build_feature_cache
from draftheads.data.cache.encode import length_batches
from draftheads.data.cache.manifest import MANIFEST
from draftheads.data.cache.read import FeatureCache
from draftheads.data.cache.views import combine_caches, write_view
from draftheads.data.prepare import prepare_dataset
from draftheads.heads.features import target_features


@pytest.fixture(scope="module")
def small_set(tiny_llama, tmp_path_factory):
    _, tok, _ = tiny_llama
    path = tmp_path_factory.mktemp("d") / "d.jsonl"
    rows = [
        {"instruction": f"Question {i}?" + " more" * (i % 7), "output": "Answer " * (1 + i % 5)}
        for i in range(12)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds, _ = prepare_dataset(DataConfig(path=str(path)), tok)
    return ds


def test_length_batches_respect_the_token_budget():
    lengths = [5, 50, 7, 48, 6, 49]
    batches = length_batches(lengths, 100)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert all(len(b) * max(lengths[i] for i in b) <= 100 for b in batches)
    assert batches[0] == [1, 5]  # the longest rows go together


def test_cache_holds_the_online_features_labels_and_topk(tmp_path, tiny_llama, small_set, capsys):
    model, tok, fp = tiny_llama
    layers = [1, 2, 4]
    m = build_feature_cache(
        model,
        tok,
        small_set,
        tmp_path,
        layers,
        dtype="float32",
        batch_tokens=256,
        target_next=True,
        topk=3,
        shard_mb=0.01,
        show_progress=False,
    )
    assert "expected" in capsys.readouterr().err
    assert len(m["shards"]) > 1 and m["complete"] and m["layers"] == layers and m["feature_dim"] == 3 * 64
    assert m["num_tokens"] == sum(len(r) for r in small_set["input_ids"])
    assert m["fingerprint"] == fp.to_dict()
    cache = FeatureCache(tmp_path, expected_fingerprint=fp, layers=layers)
    assert len(cache) == len(small_set)
    for i in (0, 5, len(cache) - 1):
        item = cache[i]
        ids = torch.tensor([small_set[i]["input_ids"]])
        feats, logits = target_features(model, ids, None, layers, with_logits=True)
        assert torch.equal(item["input_ids"], ids[0])
        assert item["loss_mask"].tolist() == small_set[i]["loss_mask"]
        torch.testing.assert_close(item["features"], feats[0], atol=1e-4, rtol=1e-4)
        assert torch.equal(item["target_next"], logits[0].argmax(-1))
        torch.testing.assert_close(item["topk_logits"], logits[0].topk(3).values, atol=1e-4, rtol=1e-4)
        assert item["topk_ids"][:, 0].tolist() == item["target_next"].tolist()


def test_cache_resumes_and_refuses_other_targets_and_layers(tmp_path, tiny_llama, small_set):
    model, tok, fp = tiny_llama
    kw = dict(dtype="bfloat16", batch_tokens=512, shard_mb=0.005, show_progress=False)
    m = build_feature_cache(model, tok, small_set, tmp_path, [4], **kw)
    first = [FeatureCache(tmp_path)[i]["features"] for i in range(len(small_set))]
    assert first[0].dtype == torch.bfloat16
    # Kill mid-way: one shard missing, manifest not complete. The rerun rebuilds only that shard.
    victim = tmp_path / m["shards"][1]["file"]
    victim.unlink()
    other = tmp_path / m["shards"][0]["file"]
    mtime = other.stat().st_mtime_ns
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps(dict(manifest, complete=False)))
    with pytest.raises(UserError, match="is incomplete; rerun `draftheads features`"):
        FeatureCache(tmp_path)
    build_feature_cache(model, tok, small_set, tmp_path, [4], **kw)
    assert victim.is_file() and other.stat().st_mtime_ns == mtime
    again = FeatureCache(tmp_path)
    assert all(torch.equal(a, again[i]["features"]) for i, a in enumerate(first))

    other_fp = dataclasses.replace(fp, hidden_size=128, name="other")
    with pytest.raises(
        UserError, match="feature cache .* was built for target .*mismatch: hidden_size.*rebuild it"
    ) as e:
        FeatureCache(tmp_path, expected_fingerprint=other_fp)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"holds layers \[4\] but the drafter reads \[1, 2, 4\]"):
        FeatureCache(tmp_path, layers=[1, 2, 4])
    with pytest.raises(UserError, match="already holds a different feature cache"):
        build_feature_cache(model, tok, small_set, tmp_path, [2], **kw)
    with pytest.raises(UserError, match=r"layer ids must be in \[0, 4\]"):
        build_feature_cache(model, tok, small_set, tmp_path / "x", [9], **kw)
    with pytest.raises(UserError, match="not a feature cache"):
        FeatureCache(tmp_path / "nowhere")


def test_combined_caches_read_each_source_in_order_repeated_and_refuse_mismatches(
    tmp_path, tiny_llama, small_set
):
    model, tok, fp = tiny_llama
    kw = dict(dtype="float32", batch_tokens=256, topk=3, shard_mb=0.01, show_progress=False)
    a, b = tmp_path / "a", tmp_path / "b"
    build_feature_cache(model, tok, small_set.select(range(5)), a, [1, 4], **kw)
    build_feature_cache(model, tok, small_set.select(range(5, 12)), b, [1, 4], **kw)
    m = combine_caches([(a, 1), (b, 2)], tmp_path / "mix")
    A, B = FeatureCache(a), FeatureCache(b)
    mix = FeatureCache(tmp_path / "mix", expected_fingerprint=fp, layers=[1, 4])
    assert len(mix) == len(A) + 2 * len(B) == 19
    assert m["num_loss_tokens"] == A.manifest["num_loss_tokens"] + 2 * B.manifest["num_loss_tokens"]
    # row i of the view is the source row it names: a's rows, then b's rows twice
    order = [(A, i) for i in range(5)] + [(B, i) for i in range(7)] * 2
    for i, (src, j) in enumerate(order):
        got, want = mix[i], src[j]
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
    # a view of a middle run of b's shards reads exactly those rows, renumbered from 0
    mid = B.manifest["shards"][1:3]
    assert len(B.manifest["shards"]) > 3
    first, last = mid[0]["rows"][0], mid[-1]["rows"][1]
    loss = sum(int(B[i]["loss_mask"].sum()) for i in range(first, last))
    v = write_view(tmp_path / "slice", B.manifest, [(b, mid)], num_loss_tokens=loss)
    part = FeatureCache(tmp_path / "slice", expected_fingerprint=fp, layers=[1, 4])
    assert v["num_rows"] == len(part) == last - first > 0
    assert part.manifest["num_loss_tokens"] == loss and "num_tokens" not in part.manifest
    for i in range(len(part)):
        assert all(torch.equal(part[i][k], B[first + i][k]) for k in B[first + i])

    other = tmp_path / "other"  # the same rows without top-k labels: a different label column
    build_feature_cache(model, tok, small_set.select(range(5)), other, [1, 4], **{**kw, "topk": 0})
    with pytest.raises(UserError, match=r"differ in topk .*rebuild .*other"):
        combine_caches([(a, 1), (other, 1)], tmp_path / "bad")
    with pytest.raises(UserError, match="repeats must be at least 1"):
        combine_caches([(a, 1), (b, 0)], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
