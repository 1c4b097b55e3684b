"""P-EAGLE's drafter on the tiny Llama target, without an oracle: the one-pass draft a decoder
calls (its shape; its depth 0 is EAGLE-3's first step on the same weights; it equals the training
group pass, with or without a cache, and feeding the group one entry at a time; batched rows
with padding equal each row alone), checkpoints, one-line refusals, and the objective (sampled
training, gradients to the mask parameters, evaluation chains, the cached top-k teacher)."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads import Drafter, EagleDrafter, drafter_kind
from draftheads.heads.masks import additive_mask
from draftheads.heads.peagle import PEagleDrafter, every_depth, group_entries, parallel_draft
from draftheads.train.modules.eagle import EagleObjective
from draftheads.train.modules.peagle import PEagleObjective
from draftheads.train.unroll import unroll
from tests.test_export import randomize

LAYERS, MASK, K, T = [1, 2, 3], 7, 4, 14


def peagle(model, fp, seed: int = 0, **kw) -> PEagleDrafter:
    kw = {"draft_vocab_size": 300, "num_depths": K, **kw}
    d = PEagleDrafter(
        fp, target_config=model.config.to_dict(), mask_token_id=MASK, feature_layers=LAYERS, **kw
    )
    randomize(d, seed)
    d.set_vocab(torch.arange(0, 3000, 10))
    d.attach(model).init_embedding_from_target()
    with torch.no_grad():
        if d.own_embedding:
            d.embed_tokens.weight.add_(torch.randn(d.embed_tokens.weight.shape) * 0.02)
        else:
            d.mask_embed.add_(torch.randn(d.mask_embed.shape))
    return d.eval()


def row_ids(length: int = T, start: int = 3) -> torch.Tensor:
    return (torch.arange(start, start + length)[None] * 13) % 280 + 10


@torch.no_grad()
def pairs(d, model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The drafter's input pairs of a row: features f_0..f_{T-2}, tokens x_1..x_{T-1}, positions."""
    hidden = model(ids, output_hidden_states=True).hidden_states
    R = ids.shape[1] - 1
    return d.select_features(hidden)[:, :R], ids[:, 1:], torch.arange(R).expand(ids.shape[0], R)


@torch.no_grad()
def training_group(d, feats, next_ids, positions, anchor: int) -> torch.Tensor:
    """The group at ``anchor`` as training computes it (every row as context): ``[1, K, H]``."""
    R = next_ids.shape[1]
    rows = torch.zeros(1, R, dtype=torch.bool)
    rows[0, anchor] = True
    a, dep, keep = group_entries(every_depth(rows, K))
    out = d.group(feats, next_ids, positions, torch.zeros_like(positions), a, dep, keep)
    at = (a[0] == anchor) & keep[0]
    return out[:, at][:, dep[0][at].argsort()]


def test_one_pass_has_k_outputs_and_depth_0_is_eagle3s_first_step(tiny_llama):
    model, _, fp = tiny_llama
    d = peagle(model, fp)
    feats, next_ids, pos = pairs(d, model, row_ids())
    with torch.no_grad():
        out = parallel_draft(d, feats, next_ids, pos, torch.ones_like(next_ids, dtype=torch.bool), K)
        assert out.shape == (1, K, 64) and d.logits(out).shape == (1, K, 300)
        e = EagleDrafter(
            fp, target_config=model.config.to_dict(), version=3, feature_layers=LAYERS, draft_vocab_size=300
        )
        e.load_state_dict({k: v for k, v in d.state_dict().items() if not k.startswith("mask_")})
        first = e.attach(model).eval().logits(unroll(e, feats, row_ids(), 1)[0])
        group = d.logits(d.group(feats, next_ids, pos, torch.zeros_like(pos), *group_entries(every_depth(
            torch.ones_like(next_ids, dtype=torch.bool), K))))  # fmt: skip
    assert torch.allclose(d.logits(out)[:, 0], first[:, -1], atol=1e-5)
    assert torch.allclose(group[:, : T - 1], first, atol=1e-5)  # every row's depth 0
    assert not torch.allclose(d.logits(out)[:, 1], first[:, -1], atol=1e-2)  # deeper ones draft ahead


def test_one_pass_equals_the_training_group_with_and_without_a_cache(tiny_llama):
    from transformers import DynamicCache

    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=1)
    feats, next_ids, pos = pairs(d, model, row_ids())
    a = T - 2
    want = d.logits(training_group(d, feats, next_ids, pos, a))
    ones = torch.ones_like(next_ids, dtype=torch.bool)
    with torch.no_grad():
        alone = parallel_draft(d, feats, next_ids, pos, ones, K)
        cache, S = DynamicCache(), 8
        parallel_draft(
            d, feats[:, :S], next_ids[:, :S], pos[:, :S], ones[:, :S], 1, cache=cache
        )  # the context
        cached = parallel_draft(
            d, feats[:, S:], next_ids[:, S:], pos[:, S:], ones[:, S:], K, ones[:, :S], cache
        )
    assert cache.get_seq_length() == T - 1  # the pairs stay, the mask entries are dropped
    assert torch.allclose(d.logits(alone), want, atol=1e-5)
    assert torch.allclose(d.logits(cached), want, atol=1e-5)
    earlier = d.logits(training_group(d, feats, next_ids, pos, a - 3))
    assert not torch.allclose(earlier, want, atol=1e-2)  # the anchor matters


def test_one_pass_equals_feeding_the_group_one_entry_at_a_time(tiny_llama):
    """Causal in depth: mask entry d read after entries 1..d-1 are cached gives the same output."""
    from transformers import DynamicCache

    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=2, norm_before_residual=True, fc_norm=True)
    feats, next_ids, pos = pairs(d, model, row_ids())
    ones = torch.ones_like(next_ids, dtype=torch.bool)
    with torch.no_grad():
        together = parallel_draft(d, feats, next_ids, pos, ones, K)
        cache = DynamicCache()
        steps = [parallel_draft(d, feats, next_ids, pos, ones, 1, cache=cache)[:, 0]]
        mask_feature = d.mask_feature()[None, None]
        for depth in range(1, K):
            seen = torch.ones(1, 1, cache.get_seq_length() + 1, dtype=torch.bool)
            mask = additive_mask(seen, mask_feature.dtype)
            ids, at = torch.tensor([[MASK]]), torch.tensor([[T - 2 + depth]])
            steps.append(d(ids, mask_feature, at, mask, cache)[:, 0])
    assert torch.allclose(torch.stack(steps, 1), together, atol=1e-5)


def test_batched_rows_with_padding_equal_each_row_alone(tiny_llama):
    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=3)
    long, short = row_ids(12), row_ids(8, start=9)
    fl, il, pl = pairs(d, model, long)
    fs, is_, ps = pairs(d, model, short)
    n, m = il.shape[1], is_.shape[1]
    with torch.no_grad():
        want_long = parallel_draft(d, fl, il, pl, torch.ones(1, n, dtype=torch.bool), K)
        want_short = parallel_draft(d, fs, is_, ps, torch.ones(1, m, dtype=torch.bool), K)
        for left in (False, True):  # right padding (after a step) and left padding (a prompt)
            pad = n - m
            cut = slice(pad, n) if left else slice(0, m)
            f2 = torch.zeros(2, n, fl.shape[-1])
            i2, p2, v2 = (
                torch.zeros(2, n, dtype=torch.long),
                torch.zeros(2, n, dtype=torch.long),
                torch.zeros(2, n, dtype=torch.bool),
            )
            f2[0], i2[0], p2[0], v2[0] = fl[0], il[0], pl[0], True
            f2[1, cut], i2[1, cut], p2[1, cut], v2[1, cut] = fs[0], is_[0], ps[0], True
            both = parallel_draft(d, f2, i2, p2, v2, K)
            assert torch.allclose(both[:1], want_long, atol=1e-5)
            assert torch.allclose(both[1:], want_short, atol=1e-5), left


@pytest.mark.parametrize("own", [False, True])
def test_a_checkpoint_round_trips_with_its_mask_parameters(tmp_path, tiny_llama, own):
    model, tok, fp = tiny_llama
    d = peagle(model, fp, seed=4, own_embedding=own, norm_output=True)
    d.save_pretrained(tmp_path / "d")
    back = Drafter.from_pretrained(tmp_path / "d", target=model, tokenizer=tok).eval()
    assert drafter_kind("peagle").drafter is PEagleDrafter and isinstance(back, PEagleDrafter)
    assert back.spec() == d.spec() and back.spec()["own_embedding"] is own and back.norm_flags["norm_output"]
    assert set(back.state_dict()) >= {"mask_hidden", "embed_tokens.weight" if own else "mask_embed"}
    feats, next_ids, pos = pairs(d, model, row_ids())
    ones = torch.ones_like(next_ids, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(
            parallel_draft(back, feats, next_ids, pos, ones, K),
            parallel_draft(d, feats, next_ids, pos, ones, K),
        )


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(mask_token_id=49152), "draft.peagle.mask_token_id=49152 is not a token id of the target"),
        (
            dict(mask_token_id=MASK, num_depths=0),
            "draft.peagle.num_depths=0: a P-EAGLE group drafts at least one token",
        ),
    ],
)
def test_impossible_settings_are_refused_in_one_line(tiny_llama, kw, match):
    model, _, fp = tiny_llama
    with pytest.raises(UserError, match=match) as err:
        PEagleDrafter(fp, target_config=model.config.to_dict(), feature_layers=LAYERS, **kw)
    assert "\n" not in str(err.value)


# ---- the objective ---------------------------------------------------------------------------
def objective(d, model) -> PEagleObjective:
    cfg = DraftConfig.of(kind="eagle", version=3, feature_layers=LAYERS, draft_vocab_size=300)
    return PEagleObjective(d, model, cfg, topk=2)


def batch_of(rows: int = 2) -> dict:
    ids = torch.cat([row_ids(20, start=3 + 5 * r) for r in range(rows)])
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :4] = 0
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}


def test_sampled_training_reaches_every_parameter_and_reports_each_depth(tiny_llama):
    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=5).train()
    torch.manual_seed(0)
    loss, stats = objective(d, model)(batch_of())
    loss.backward()
    for name, p in d.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name
    counts = [float(stats[f"depth{k}/loss_n"]) for k in range(K)]
    assert counts[0] == 2 * 16 and counts[0] > counts[1] > counts[2] > counts[3] > 0  # conditional drop
    assert all(f"depth{k}/top2" in stats for k in range(K))


def test_evaluation_chains_are_chunk_free_and_depth_0_is_eagle3s(tiny_llama):
    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=6)
    batch = batch_of()
    obj = objective(d, model)
    correct, valid = obj.chains(batch, K)
    chunked, valid2 = obj.chains(batch, K, chunk=5)
    assert correct.shape == valid.shape == (K, 2, 19) and torch.equal(valid, valid2)
    assert torch.equal(correct, chunked)
    e = EagleDrafter(
        fp, target_config=model.config.to_dict(), version=3, feature_layers=LAYERS, draft_vocab_size=300
    )
    e.load_state_dict({k: v for k, v in d.state_dict().items() if not k.startswith("mask_")})
    cfg = DraftConfig.of(kind="eagle", version=3, feature_layers=LAYERS, draft_vocab_size=300, ttt_steps=1)
    eagle_correct, eagle_valid = EagleObjective(e.attach(model).eval(), model, cfg, 1).chains(batch, 1)
    assert torch.equal(correct[0], eagle_correct[0]) and torch.equal(valid[0], eagle_valid[0])


def test_the_cached_top_k_teacher_gives_the_dense_kl_when_it_holds_the_vocabulary(tiny_llama):
    """KL against the target's top-k (renormalised over the draft vocabulary) equals the dense KL
    once k covers every token, so the cached-feature path trains the same objective."""
    model, _, fp = tiny_llama
    d = peagle(model, fp, seed=7)
    obj, batch = objective(d, model), batch_of()
    found = obj.sample(batch, torch.Generator().manual_seed(1))
    dense, _ = obj.loss(batch, found)
    with torch.no_grad():
        top = model(batch["input_ids"]).logits.topk(fp.vocab_size, dim=-1)
    sparse, _ = obj.loss({**batch, "topk_ids": top.indices, "topk_logits": top.values}, found)
    assert torch.allclose(sparse, dense, atol=1e-5) and float(dense.detach()) > 0
