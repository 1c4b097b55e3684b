"""Teacher-forced data (``data=teacher``): text the target did not write, labelled by the
target's own top-k distribution at every position, and EAGLE-3 learning that distribution; the
EAGLE layer initialised from the target's last layer."""

from __future__ import annotations

import datasets
import pytest
import torch

from draftheads.conf.commands.compose import compose
from draftheads.data.cache.build import build_feature_cache
from draftheads.data.cache.encode import labelled
from draftheads.data.cache.read import FeatureCache
from draftheads.data.prepare import prepare_dataset
from draftheads.heads.features import target_features
from draftheads.train.batching import collate, right_pad
from draftheads.train.drafters import build_drafter
from draftheads.train.modules import EagleObjective
from draftheads.train.recipe import TrainRecipe
from tests.conftest import get_target

TOPK = 8


def teacher_config(tmp_path, *overrides: str):
    """``data=teacher`` with no external data: the optional components point at nothing."""
    cfg, _ = compose(
        [
            "target=tiny-llama",
            "data=teacher",
            f"data.data_dir={tmp_path / 'no-data'}",
            "data.max_rows=4",
            "data.max_length=256",
            "draft=eagle3",
            "draft.eagle.ttt_steps=2",
            "draft.eagle.draft_vocab_size=512",
            "draft.eagle.feature_loss_weight=0",
            *overrides,
        ]
    )
    for comp in cfg.data.mixture:
        if comp["name"] == "self":
            comp["path"] = str(tmp_path / "no-distill")
    return cfg


@pytest.fixture(scope="module")
def teacher_rows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("teacher")
    cfg = teacher_config(tmp)
    _, tok = get_target("llama")
    ds, report = prepare_dataset(cfg.data, tok, "train")
    return cfg, ds, report, tmp


def test_teacher_preset_works_without_external_data_and_says_what_it_left_out(teacher_rows):
    cfg, ds, report, _ = teacher_rows
    assert cfg.data.features.topk == 64
    assert {s.name for s in report.sources} == {"humaneval", "pydoc", "stdlib"}
    assert [m.split()[0] for m in report.missing] == ["gsm8k", "codealpaca", "self"]
    assert "left out optional component gsm8k" in report.format()
    assert all(s.kept > 0 for s in report.sources)  # HumanEval's canonical solutions included
    assert set(ds["source"]) <= {"humaneval", "pydoc", "stdlib"} and len(ds) > 0


def test_teacher_rows_carry_the_targets_own_topk_and_one_step_learns_it(teacher_rows):
    cfg, ds, _, tmp = teacher_rows
    model, tok = get_target("llama")
    layers = cfg.draft.training_layers(model.config.num_hidden_layers)
    rows = ds.select_columns(["input_ids", "loss_mask"]).select(range(6))
    build_feature_cache(
        model, tok, rows, tmp / "cache", layers, dtype="float32", topk=TOPK, show_progress=False
    )
    cache = FeatureCache(tmp / "cache")
    full_ids, full_vals = [], []
    for i in range(len(cache)):
        r = cache[i]
        ids = r["input_ids"][None]
        final, _ = target_features(model, ids, torch.ones_like(ids), [model.config.num_hidden_layers])
        vals, top = model.lm_head(final)[0].float().topk(TOPK, dim=-1)
        # where the next token is an answer token: the target's top-k, not the text; elsewhere nothing
        read = torch.tensor(labelled(r["loss_mask"].tolist()))
        assert 0 < int(read.sum()) < len(read)
        assert torch.equal(r["topk_ids"][read], top[read])
        torch.testing.assert_close(r["topk_logits"][read].float(), vals[read], rtol=1e-4, atol=1e-4)
        assert not r["topk_ids"][~read].any() and not r["topk_logits"][~read].any()
        full_ids.append(torch.where(read[:, None], r["topk_ids"], top))
        full_vals.append(torch.where(read[:, None], r["topk_logits"], vals))

    torch.manual_seed(0)
    # a draft vocabulary of the whole target vocabulary, so every top-k entry is a label
    cfg = teacher_config(tmp, f"draft.eagle.draft_vocab_size={model.config.vocab_size}")
    drafter = build_drafter(cfg, model, tok)
    objective = EagleObjective(drafter, model, cfg.draft, 5)
    batch = collate([cache[i] for i in range(len(cache))], tok.pad_token_id or 0)
    opt = torch.optim.Adam([p for p in objective.parameters() if p.requires_grad], lr=3e-3)
    before, _ = objective(batch)
    # the positions left out are never read: filled with the target's top-k, the loss is the same
    full = dict(
        batch,
        topk_ids=right_pad(full_ids, batch["topk_ids"].shape[1]),
        topk_logits=right_pad(full_vals, batch["topk_ids"].shape[1]),
    )
    with torch.no_grad():
        assert torch.equal(objective(full)[0], before.detach())
    before.backward()
    opt.step()
    with torch.no_grad():
        after, _ = objective(batch)
    assert float(after) < float(before.detach())
    # the labels are the cached distribution: a sharper one (same top-k, same text) is another loss
    swapped = dict(batch, topk_logits=batch["topk_logits"] * 1000)
    with torch.no_grad():
        assert not torch.isclose(objective(swapped)[0], after)


@pytest.mark.parametrize("version", [1, 3])
def test_init_from_target_starts_the_drafter_layer_as_the_targets_last_layer(tmp_path, version):
    from tests.test_train_recipe import config, make_rows

    model, _ = get_target("llama")
    H = model.config.hidden_size
    draft = "draft=eagle3" if version == 3 else "draft=eagle"
    last = model.model.layers[-1]
    for init in (True, False):
        cfg = config(
            tmp_path, draft, f"draft.eagle.init_from_target={str(init).lower()}", name=f"v{version}-{init}"
        )
        layer = TrainRecipe(cfg, make_rows()).setup().drafter.layers[0]
        same = torch.equal(layer.mlp.down_proj.weight, last.mlp.down_proj.weight)
        q = layer.self_attn.q_proj.weight
        if version == 3:  # [embedding half | feature half]
            assert q.shape[1] == 2 * H
            assert same == init and torch.equal(q[:, H:], last.self_attn.q_proj.weight) == init
            assert bool((q[:, :H] == 0).all()) == init
        else:
            assert same == init and torch.equal(q, last.self_attn.q_proj.weight) == init


def test_top_k_labels_a_drafter_cannot_learn_from_are_refused_in_one_line(tmp_path):
    """A cache's top-k logits under a drafter that needs the full distribution (EAGLE-1), and
    ``train.soft_labels=topk`` for one that does not learn from them (Medusa), each stop in one
    line naming the kind and the setting to use; EAGLE-3 reads them."""
    from draftheads.conf.errors import UserError
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.conf.schema.train import TrainConfig
    from draftheads.train.guards import use_topk

    model, tok = get_target("llama")
    rows = datasets.Dataset.from_dict({"input_ids": [list(range(5, 17))], "loss_mask": [[0] * 4 + [1] * 8]})
    build_feature_cache(model, tok, rows, tmp_path, [2, 4], dtype="float32", topk=TOPK, show_progress=False)
    cache = FeatureCache(tmp_path)
    with pytest.raises(UserError) as e:
        use_topk(cache, TrainConfig(), DraftConfig.of("eagle", version=1))
    assert str(e.value) == (
        f"feature cache {cache.dir} holds top-k logits, but this drafter (draft.kind=eagle) learns the "
        "full-vocabulary distribution, which top-k would cut; pass train.soft_labels=full (projected "
        "from the cached states)"
    )
    with pytest.raises(
        UserError, match=r"which this drafter \(draft.kind=medusa\) does not learn from; use "
    ):
        use_topk(cache, TrainConfig(soft_labels="topk", features="offline"), DraftConfig.of("medusa"))
    assert use_topk(cache, TrainConfig(), DraftConfig.of("eagle", version=3))
    assert not use_topk(cache, TrainConfig(soft_labels="full"), DraftConfig.of("eagle", version=1))
