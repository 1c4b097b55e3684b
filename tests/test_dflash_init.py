"""A DFlash drafter's starting weights: ``draft.dflash.anchor_prior`` (the first layer's block rows start
reading their anchor row, in one rotary dimension that no context state and no mask row has) and
``draft.dflash.out_gain`` (the output norm's starting gain)."""

from __future__ import annotations

import inspect

import pytest
import torch

from bench.lab.block_attention import position1_attention, shares
from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads import DFlashDrafter, Drafter, fingerprint
from draftheads.heads.dflash import choose_mask_token
from draftheads.heads.dflash.anchor_prior import anchor_direction, prior_gain, set_anchor_prior
from draftheads.heads.features import target_features
from draftheads.train.recipe import train
from tests.conftest import get_target
from tests.test_dflash_recipe import rows  # noqa: F401  (the module's training rows)
from tests.test_train_dflash import DFLASH
from tests.test_train_recipe import config, tiny_target


def test_the_anchor_direction_reads_one_on_the_rows_and_zero_on_the_mask():
    g = torch.Generator().manual_seed(0)
    common = torch.randn(32, generator=g, dtype=torch.float64)
    x = common + 0.3 * torch.randn(500, 32, generator=g, dtype=torch.float64)  # rows sharing a direction
    mask = torch.randn(32, generator=g, dtype=torch.float64)
    w = anchor_direction(x, mask)
    assert abs(float(w @ mask)) < 1e-12
    assert abs(float((x @ w).mean()) - 1) < 0.02 and float((x @ w).std()) < 0.2


def smollm2_drafter(boost: float) -> DFlashDrafter:
    """A fresh SmolLM2 DFlash drafter (seeded) with the prior at ``boost`` (0: none)."""
    target, tok = get_target("smollm2")
    torch.manual_seed(0)
    d = DFlashDrafter(
        fingerprint(target, tok), target.config.to_dict(), choose_mask_token(tok), draft_vocab_size=4096
    )
    d.attach(target).set_vocab(torch.arange(4096))
    if boost:
        set_anchor_prior(d, boost, d.target_ids())
    return d


@torch.no_grad()
def test_block_position_1_starts_on_its_anchor_and_no_context_state_carries_the_prior():
    plain, primed = smollm2_drafter(0.0), smollm2_drafter(5.0)
    target, tok = get_target("smollm2")
    ids = tok(inspect.getsource(inspect)[20000:26000], return_tensors="pt").input_ids[:, :160]
    feats, _ = target_features(target, ids, torch.ones_like(ids), plain.feature_layers())
    anchors, T = torch.arange(32, 144, 7)[None], ids.shape[1]
    before = shares(position1_attention(plain, feats, ids, anchors), anchors, T, 16)
    after = shares(position1_attention(primed, feats, ids, anchors), anchors, T, 16)
    assert before["anchor row"] < 0.03 and after["anchor row"] > 0.3
    assert after["mask rows"] <= before["mask rows"]  # the boost is the anchor's, not the block's

    attn, i = primed.layers[0].self_attn, primed.layers[0].self_attn.head_dim // 2 - 1
    heads = lambda k: k.unflatten(-1, (-1, attn.head_dim))[..., i]  # noqa: E731
    ctx = primed.fuse(feats)
    assert heads(attn.k_proj(ctx)).abs().max() < 1e-5 * attn.k_proj(ctx).abs().max()  # none, to rounding
    mask = primed.layers[0].input_layernorm(primed.embed(torch.tensor([primed.mask_token_id])))
    assert heads(attn.k_proj(mask)).abs().max() < 1e-5
    assert torch.allclose(attn.q_norm.weight[i], torch.tensor(prior_gain(5.0, attn.head_dim)))


def test_the_prior_reaches_the_checkpoint_through_training_and_a_negative_boost_is_refused(tmp_path, rows):  # noqa: F811
    out = train(
        config(tmp_path, *DFLASH, "draft.dflash.anchor_prior=4", "train.lr=1e-12", "train.max_steps=1"),
        rows,
        target=tiny_target(),
    )
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    attn = d.layers[0].self_attn
    i = attn.head_dim // 2 - 1
    gain = prior_gain(4.0, attn.head_dim)
    for norm in (attn.q_norm, attn.k_norm):
        assert norm.weight[i].item() == pytest.approx(gain, rel=1e-5)
        assert torch.equal(norm.weight[:i], torch.ones(i))
    ctx = d.fuse(torch.randn(3, 7, d.fc.in_features))  # any features: no component along the prior
    assert attn.k_proj(ctx).unflatten(-1, (-1, attn.head_dim))[..., i].abs().max() < 1e-4
    with pytest.raises(UserError, match=r"draft.dflash.anchor_prior=-1.0 must not be negative") as e:
        DraftConfig.of(kind="dflash", anchor_prior=-1.0)
    assert "\n" not in str(e.value)


def test_out_gain_scales_the_first_draft_logits_and_a_non_positive_one_is_refused(tmp_path, rows):  # noqa: F811
    out = train(
        config(tmp_path, *DFLASH, "draft.dflash.out_gain=0.25", "train.lr=1e-12", "train.max_steps=1"),
        rows,
        target=tiny_target(),
    )
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    torch.testing.assert_close(d.norm.weight, torch.full_like(d.norm.weight, 0.25), rtol=0, atol=1e-6)
    x = torch.randn(2, 5, d.fc.out_features)
    scaled = d.logits(d.norm(x))
    d.norm.weight.data.fill_(1.0)
    torch.testing.assert_close(scaled, 0.25 * d.logits(d.norm(x)))  # the head is linear, bias-free
    with pytest.raises(UserError, match=r"draft.dflash.out_gain=0.0 must be positive") as e:
        DraftConfig.of(kind="dflash", out_gain=0.0)
    assert "\n" not in str(e.value)
