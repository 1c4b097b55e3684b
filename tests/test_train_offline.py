"""Where target features meet the drafter: a default (bfloat16) feature cache and a bfloat16
target train fp32 drafters; top-k soft labels from the cache; exact EAGLE-3 logged losses."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.data.cache.build import build_feature_cache
from draftheads.data.cache.read import CacheColumns
from draftheads.heads import Drafter
from draftheads.heads.features import target_features
from draftheads.train.batching import collate
from draftheads.train.drafters import build_drafter
from draftheads.train.metrics import Window
from draftheads.train.modules import EagleObjective
from draftheads.train.objectives import (
    label_mask,
    soft_cross_entropy,
    sparse_soft_cross_entropy,
    topk_teacher,
)
from draftheads.train.recipe import train
from tests.conftest import get_target
from tests.test_train_recipe import config, losses, make_rows, tiny_target

EAGLE3 = (
    "draft=eagle3",
    "draft.eagle.ttt_steps=2",
    "train.lr=3e-3",
    "train.max_steps=2",
    "train.eval_every=2",
)


@pytest.fixture(scope="module")
def rows():
    return make_rows()


def feature_cache(tmp_path, rows, draft: str = "draft=eagle3", **kw):
    """A cache built with the defaults (bfloat16 features) for the drafter ``draft``."""
    model, tok = get_target("llama")
    cfg = config(tmp_path, draft)
    layers = cfg.draft.training_layers(model.config.num_hidden_layers)
    directory = tmp_path / f"cache-{draft[6:]}-{kw.get('topk', 0)}"
    m = build_feature_cache(model, tok, rows, directory, layers, show_progress=False, **kw)
    assert m["dtype"] == "bfloat16"
    return directory


def test_a_default_feature_cache_trains_an_fp32_drafter_end_to_end(tmp_path, rows):
    cache = feature_cache(tmp_path, rows)
    out = train(
        config(tmp_path, *EAGLE3, "train.features=offline", f"train.feature_cache={cache}"),
        target=tiny_target(),
    )
    assert len(losses(out)) == 2 and all(torch.isfinite(torch.tensor(losses(out))))
    model, tok = get_target("llama")
    assert Drafter.from_pretrained(out, target=model, tokenizer=tok).version == 3


def test_training_streams_the_cache_from_disk_and_resumes_exactly(tmp_path, rows):
    cache = feature_cache(tmp_path, rows)
    offline = (*EAGLE3, "train.max_steps=4", "train.features=offline", f"train.feature_cache={cache}")
    seen = []
    straight = losses(
        train(config(tmp_path, *offline, name="straight"), hooks=[seen.append], target=tiny_target())
    )
    # Rows are read from the memory-mapped cache when a micro-batch is built, never held as a list.
    assert isinstance(seen[0].train_rows.source, CacheColumns)
    assert "features" in seen[0].train_rows[0] and "features" not in seen[0].train_tokens[0]
    train(
        config(tmp_path, *offline, "train.stop_at=2", "train.save_every=2", name="cut"), target=tiny_target()
    )
    assert losses(train(config(tmp_path, *offline, name="cut"), target=tiny_target())) == straight
    # EAGLE-1 reads one of the layers the EAGLE-3 cache holds: it trains from the same cache
    eagle1 = train(
        config(tmp_path, "draft=eagle", "train.max_steps=2", *offline[-2:], name="eagle1"),
        target=tiny_target(),
    )
    assert all(torch.isfinite(torch.tensor(losses(eagle1))))
    # EAGLE-3 reads layers that an EAGLE-1 cache lacks: refused before training
    eagle1_cache = (
        "train.features=offline",
        f"train.feature_cache={feature_cache(tmp_path, rows, 'draft=eagle')}",
    )
    with pytest.raises(UserError, match=r"holds layers .*, not .* that the drafter reads .*rebuild it"):
        train(config(tmp_path, *EAGLE3, *eagle1_cache, name="other-layers"), target=tiny_target())


def test_topk_cache_trains_eagle3_and_is_refused_where_full_logits_are_needed(tmp_path, rows):
    cache = feature_cache(tmp_path, rows, topk=16)
    offline = ("train.features=offline", f"train.feature_cache={cache}")
    out = train(config(tmp_path, *EAGLE3, *offline, name="topk"), target=tiny_target())
    assert all(torch.isfinite(torch.tensor(losses(out))))
    eagle1 = (
        "train.features=offline",
        f"train.feature_cache={feature_cache(tmp_path, rows, 'draft=eagle', topk=16)}",
    )
    with pytest.raises(
        UserError, match=r"holds top-k logits, but this drafter \(draft.kind=eagle\).*soft_labels=full"
    ):
        train(
            config(tmp_path, "draft=eagle", "train.max_steps=1", *eagle1, name="eagle1"), target=tiny_target()
        )
    assert not (tmp_path / "eagle1" / "metrics.jsonl").exists()
    plain = feature_cache(tmp_path, rows)
    with pytest.raises(UserError, match="stores no top-k logits; rebuild it with data.features.topk"):
        train(
            config(
                tmp_path, *EAGLE3, "train.features=offline", f"train.feature_cache={plain}",
                "train.soft_labels=topk", name="plain",
            ), target=tiny_target()
        )  # fmt: skip


@pytest.mark.parametrize("draft", ["draft=eagle", "draft=eagle3", "draft=medusa"])
def test_a_bfloat16_target_trains_an_fp32_drafter(tmp_path, rows, draft):
    cfg = config(tmp_path, draft, "target.dtype=bfloat16", "train.max_steps=2", "train.eval_every=2")
    assert all(torch.isfinite(torch.tensor(losses(train(cfg, rows)))))


def test_topk_loss_equals_the_full_vocabulary_loss_restricted_to_the_same_support():
    g = torch.Generator().manual_seed(0)
    V, D, N, k = 50, 20, 6, 8
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.randperm(V, generator=g)[:D]] = True
    draft_ids = t2d.nonzero().flatten()
    teacher = torch.randn(N, V, generator=g) * 3
    teacher[:, draft_ids[0]] += 10  # every row keeps at least one top-k entry in the draft vocabulary
    student = torch.randn(N, D, generator=g)
    vals, ids = teacher.topk(k, dim=-1)
    support = torch.full_like(teacher, float("-inf")).scatter(1, ids, vals)
    full = soft_cross_entropy(student, support[:, draft_ids])
    sparse = sparse_soft_cross_entropy(student, *topk_teacher(ids, vals, t2d))
    torch.testing.assert_close(sparse, full)


def test_eagle3_logged_loss_weights_each_micro_batch_by_its_counted_rows(tmp_path, rows):
    model, tok = get_target("llama")
    cfg = config(tmp_path, "draft=eagle3", "draft.eagle.ttt_steps=1")
    drafter = build_drafter(cfg, model, tok)
    batches = [collate(list(rows.select(r)), 0) for r in (range(0, 3), range(3, 8))]

    def greedy(batch):  # the target's top-1 at each position
        final, _ = target_features(
            model, batch["input_ids"], batch["attention_mask"], [model.config.num_hidden_layers]
        )
        return model.lm_head(final).argmax(-1)

    # A draft vocabulary holding every other token the target predicts, so some rows do not count.
    seen = torch.cat([greedy(b).flatten() for b in batches]).unique()
    rest = torch.tensor(
        [i for i in range(drafter.target_fingerprint.vocab_size) if i not in set(seen.tolist())]
    )
    drafter.set_vocab(torch.cat([seen[::2], rest])[: drafter.draft_vocab_size])
    objective = EagleObjective(drafter, model, cfg.draft, 5)
    window, num, den = Window(), 0.0, 0
    for batch in batches:
        loss, stats = objective(batch)
        window.add(stats)
        # by hand: rows t whose x_{t+2} is trained and whose target top-1 at t+1 is drafted
        counted = label_mask(batch["loss_mask"], 2) & drafter.t2d[torch.roll(greedy(batch), -1, 1)]
        n = int(counted.sum())
        assert 0 < n < int(label_mask(batch["loss_mask"], 2).sum())
        num, den = num + float(loss.detach()) * n, den + n
    assert window.reduce()["step0/loss"] == pytest.approx(num / den, rel=1e-6)


def test_packed_micro_batches_log_the_padded_runs_losses(tmp_path, rows):
    """Rows from a feature cache go end to end into one row per micro-batch (no padding): the
    run's losses are the padded run's, and only the batch shape differs."""
    cache = feature_cache(tmp_path, rows, topk=8)
    offline = (*EAGLE3, "train.max_steps=3", "train.features=offline", f"train.feature_cache={cache}")
    shape, logged = {}, {}
    for name, flag in (("packed", "true"), ("padded", "false")):
        seen = []
        out = train(
            config(tmp_path, *offline, f"train.pack_micro_batches={flag}", name=name),
            hooks=[seen.append],
            target=tiny_target(),
        )
        shape[name] = tuple(seen[0].batch(seen[0].train_rows[:4])["input_ids"].shape)
        logged[name] = losses(out)
    assert shape["packed"] == (1, sum(len(r["input_ids"]) for r in seen[0].train_rows[:4]))
    assert shape["padded"][0] == 4
    torch.testing.assert_close(
        torch.tensor(logged["packed"]), torch.tensor(logged["padded"]), rtol=1e-4, atol=1e-5
    )
