"""The levers of the reference DFlash recipe: the spread feature-layer rule, a block at every
answer position (trained in bounded passes), layers started from the target's, the warm-up
ratio, and the refusals that guard them (anchor counts, depths, regenerated data)."""

from __future__ import annotations

import json

import pytest
import torch

from bench.lab.ablation_rows import ABLATIONS, ONE_LAYER
from bench.lab.rows import check_ablations, row_layers, row_settings, split_overrides
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.kinds.dflash import spread_layers
from draftheads.data.regenerated import check_regenerated_by
from draftheads.heads import Drafter, fingerprint
from draftheads.train.metrics import read_metrics
from draftheads.train.modules import DFlashObjective
from draftheads.train.recipe import train
from tests.conftest import get_target
from tests.test_train_dflash import DFLASH, drafter_and_batch
from tests.test_train_recipe import config, losses, make_rows, tiny_target

# a starting-weights lever on its own: without the anchor prior, which rewrites one q/k row per head after it
ALONE = ("draft.dflash.anchor_prior=0",)
ONE = [f"{k}={v}" for k, v in ONE_LAYER.items()]  # the one-layer recipe every DFlash row keeps


@pytest.fixture(scope="module")
def rows():
    return make_rows()


def test_spread_rule_is_one_target_layer_per_drafter_layer_from_1_to_l_minus_3():
    # the reference rule on a 30-layer target (SmolLM2-135M): L//2 alone, else evenly from 1 to 27
    assert spread_layers(30, 1) == [15]
    assert spread_layers(30, 2) == [1, 27]
    assert spread_layers(30, 3) == [1, 14, 27]
    assert spread_layers(30, 5) == [1, round(1 + 26 / 4), 14, round(1 + 3 * 26 / 4), 27]
    for depth in range(2, 28):
        ids = spread_layers(30, depth)
        assert len(set(ids)) == depth and ids == sorted(ids) and ids[0] == 1 and ids[-1] == 27
    d = DraftConfig.of(kind="dflash", num_decoder_layers=3, feature_rule="spread")
    assert d.training_layers(30) == [1, 14, 27]
    assert DraftConfig.of(kind="dflash", num_decoder_layers=3).training_layers(30) == [
        2,
        15,
        27,
    ]  # eagle3 rule


def test_a_depth_the_spread_rule_cannot_place_is_refused_in_one_line():
    with pytest.raises(
        UserError, match=r"num_decoder_layers=5 with draft.dflash.feature_rule=spread needs 5"
    ) as e:
        spread_layers(6, 5)
    assert "\n" not in str(e.value) and "feature_rule=eagle3" in str(e.value)
    with pytest.raises(UserError, match=r"draft.dflash.feature_rule='wide' is unknown"):
        DraftConfig.of(kind="dflash", feature_rule="wide")


def test_training_a_spread_drafter_reads_the_rules_layers(tmp_path, rows):
    out = train(
        config(
            tmp_path,
            *DFLASH,
            "draft.dflash.feature_rule=spread",
            "draft.dflash.num_decoder_layers=1",
            "train.max_steps=2",
        ),
        rows,
        target=tiny_target(),
    )
    model, tok = get_target("llama")
    assert Drafter.from_pretrained(out, target=model, tokenizer=tok).feature_layers() == [2]  # L // 2
    with pytest.raises(UserError, match=r"the target has 4 layers"):
        train(
            config(
                tmp_path,
                *DFLASH,
                "draft.dflash.feature_rule=spread",
                "draft.dflash.num_decoder_layers=2",
                name="deep",
            ),
            rows,
            target=tiny_target(),
        )


@pytest.mark.parametrize("anchors", [0, 3])
def test_blocks_drafted_in_bounded_passes_give_the_one_pass_loss_and_gradients(anchors):
    """Training drafts its blocks TRAIN_ANCHORS per row at a time: the loss, every gradient and
    the summed stats equal one pass over all of them (blocks never see each other)."""
    model, d, batch = drafter_and_batch(soft=True)
    cfg = DraftConfig.of(kind="dflash", block_size=4, anchors_per_row=anchors)
    results = []
    for chunk in (64, 2):
        obj = DFlashObjective(d, model, cfg, topk=5)
        obj.TRAIN_ANCHORS = chunk
        d.zero_grad()
        torch.manual_seed(3)
        loss, stats = obj(batch)
        loss.backward()
        results.append(
            (loss.detach(), stats, {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None})
        )
    (l1, s1, g1), (l2, s2, g2) = results
    torch.testing.assert_close(l1, l2)
    assert g1.keys() == g2.keys() and g1
    for n in g1:
        torch.testing.assert_close(g1[n], g2[n], rtol=1e-5, atol=1e-7)
    for k in ("pos1/n", "pos1/top1", "block/n", "block/tau_sum"):
        torch.testing.assert_close(s1[k], s2[k])
    if anchors == 0:  # a block at every candidate anchor: 7 in the packed row (both documents)
        assert s1["block/n"] == 7


def test_an_anchor_count_above_every_rows_answer_tokens_is_refused_before_training(tmp_path, rows):
    most = max(sum(r["loss_mask"]) for r in rows)
    with pytest.raises(
        UserError, match=rf"anchors_per_row={most + 1} is above .* \({most}\).* or 0 for"
    ) as e:
        train(
            config(tmp_path, *DFLASH, f"draft.dflash.anchors_per_row={most + 1}", name="many"),
            rows,
            target=tiny_target(),
        )
    assert "\n" not in str(e.value)
    assert not (tmp_path / "many" / "metrics.jsonl").exists()
    every = train(
        config(tmp_path, *DFLASH, "draft.dflash.anchors_per_row=0", "train.max_steps=2", name="every"),
        rows,
        target=tiny_target(),
    )
    assert all(map(torch.isfinite, map(torch.tensor, losses(every))))


def test_init_from_target_starts_dflash_layers_as_the_targets_last(tmp_path, rows):
    out = train(
        config(
            tmp_path,
            *DFLASH,
            *ALONE,
            "draft.dflash.num_decoder_layers=1",
            "draft.dflash.init_from_target=true",
            "train.lr=1e-12",
            "train.max_steps=1",
        ),
        rows,
        target=tiny_target(),
    )
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    last = model.model.layers[-1]
    for name in (
        "self_attn.q_proj.weight",
        "self_attn.v_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
    ):
        torch.testing.assert_close(d.layers[0].state_dict()[name], last.state_dict()[name], rtol=0, atol=1e-8)
    with pytest.raises(
        UserError,
        match=r"num_decoder_layers=5 with draft.dflash.init_from_target=true: the target has only 4",
    ):
        train(
            config(
                tmp_path,
                *DFLASH,
                "draft.dflash.init_from_target=true",
                "draft.dflash.num_decoder_layers=5",
                name="d5",
            ),
            rows,
            target=tiny_target(),
        )


def test_qk_gain_starts_the_attention_sharper_by_its_square(tmp_path, rows):
    out = train(
        config(tmp_path, *DFLASH, *ALONE, "draft.dflash.qk_gain=3", "train.lr=1e-12", "train.max_steps=1"),
        rows,
        target=tiny_target(),
    )
    model, tok = get_target("llama")
    attn = Drafter.from_pretrained(out, target=model, tokenizer=tok).layers[0].self_attn
    for norm in (attn.q_norm, attn.k_norm):
        torch.testing.assert_close(norm.weight, torch.full_like(norm.weight, 3.0), rtol=0, atol=1e-6)
    # unit-RMS heads times the gain: every logit q·k/sqrt(D) is gain² = 9 times the gain-1 one
    x = torch.randn(1, 5, attn.q_proj.in_features)
    heads = [(attn.q_norm, attn.q_proj), (attn.k_norm, attn.k_proj)]
    gained = tuple(n(p(x).unflatten(-1, (-1, attn.head_dim))) for n, p in heads)
    for norm in (attn.q_norm, attn.k_norm):
        norm.weight.data.fill_(1.0)
    plain = tuple(n(p(x).unflatten(-1, (-1, attn.head_dim))) for n, p in heads)
    for a, b in zip(gained, plain):
        torch.testing.assert_close(a, 3.0 * b)
    with pytest.raises(UserError, match=r"draft.dflash.qk_gain=0.0 must be positive"):
        DraftConfig.of(kind="dflash", qk_gain=0.0)


def test_warmup_ratio_warms_up_over_that_share_of_the_steps(tmp_path, rows):
    def lrs(*extra, name):
        out = train(
            config(tmp_path, *DFLASH, "train.max_steps=10", *extra, name=name), rows, target=tiny_target()
        )
        return [r["lr/drafter"] for r in read_metrics(out) if "lr/drafter" in r]

    warm, cold = lrs("train.warmup_ratio=0.4", name="warm"), lrs(name="cold")
    assert warm[:4] == sorted(warm[:4]) and warm[0] < 0.5 * max(warm)  # 4 warm-up steps of 10
    assert cold[0] > 0.9 * 1e-2  # no warm-up: cosine from the full rate
    with pytest.raises(UserError, match=r"train.warmup_ratio=1.5 must be in \[0, 1\)"):
        train(config(tmp_path, *DFLASH, "train.warmup_ratio=1.5", name="bad"), rows, target=tiny_target())


def test_answers_regenerated_by_another_target_are_refused(tmp_path):
    model, tok = get_target("llama")
    other, other_tok = get_target("qwen2")
    folder = tmp_path / "distilled"
    folder.mkdir()
    (folder / "distill.json").write_text(json.dumps({"fingerprint": fingerprint(other, other_tok).to_dict()}))
    cfg = config(tmp_path, f"data.path={folder}").data
    with pytest.raises(
        UserError, match=r"holds answers regenerated by .*regenerate them with draftheads distill"
    ) as e:
        check_regenerated_by(cfg, fingerprint(model, tok))
    assert "\n" not in str(e.value)
    (folder / "distill.json").write_text(json.dumps({"fingerprint": fingerprint(model, tok).to_dict()}))
    check_regenerated_by(cfg, fingerprint(model, tok))  # its own answers pass


def test_bench_rows_split_data_and_passes_and_the_cache_holds_every_rows_layers():
    trained, data, epochs = row_settings(split_overrides(ABLATIONS["dflash regenerated"])[0])
    assert (trained, data, epochs) == (["draft=dflash", *ONE], "regenerated", None)
    assert row_settings(["draft=dflash", "bench.epochs=2"]) == (["draft=dflash"], "teacher", 2.0)
    layers = row_layers(["eagle3", "dflash 3 layers spread", "dflash spread"], ["eagle3"], 30)
    assert layers == sorted({2, 15, 27, 30} | {1, 14, 27} | {15})
    with pytest.raises(UserError, match=r"row 'dflash regenerated' trains on the target's regenerated"):
        check_ablations(BenchConfig(ablations=["dflash regenerated"], distill_prompts=0, teacher_tokens=1000))
    check_ablations(BenchConfig(ablations=["dflash regenerated"], distill_prompts=8, teacher_tokens=1000))
