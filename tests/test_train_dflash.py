"""DFlash training: anchors, block masks, labels, decay and simulated block acceptance (pure
functions, hand-built rows), the objective against a block-by-block recomputation, and
``train`` runs on the tiny target (learning, offline = online, resume, refusals)."""

from __future__ import annotations

import json
import math

import datasets
import pytest
import torch
import torch.nn.functional as F

from draftheads.conf.cli import compose
from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.train import validate
from draftheads.data.cache.build import build_feature_cache
from draftheads.data.outdir import release_out_dir
from draftheads.heads import DFlashDrafter, Drafter, fingerprint
from draftheads.train.metrics import read_metrics
from draftheads.train.modules import DFlashObjective
from draftheads.train.modules.dflash_blocks import (
    anchor_candidates,
    block_acceptance,
    block_decay,
    block_mask,
    block_positions,
    block_targets,
    chunked_anchors,
    documents,
    dpace_weights,
    sample_anchors,
    token_uniforms,
)
from draftheads.train.recipe import train
from tests.conftest import get_target
from tests.test_decode_dflash import dflash
from tests.test_train_recipe import config, losses, make_rows, tiny_target

DFLASH = ("draft=dflash", "draft.dflash.block_size=4", "draft.dflash.anchors_per_row=4", "train.lr=1e-2")


@pytest.fixture(scope="module")
def rows():
    return make_rows()


def packed_row() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two documents end to end: A = 2 prompt + 4 answer tokens, B = 2 prompt + 3 answer tokens."""
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4]])
    loss = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1]])
    return pos, loss, torch.ones_like(loss, dtype=torch.bool)


def test_block_mask_labels_and_positions_of_a_hand_built_packed_row():
    pos, loss, valid = packed_row()
    docs = documents(valid, pos)
    # an anchor's next token is an answer token of its own document
    assert anchor_candidates(loss, pos)[0].nonzero().flatten().tolist() == [1, 2, 3, 4, 7, 8, 9]
    anchors, keep = torch.tensor([[2, 4, 7]]), torch.ones(1, 3, dtype=torch.bool)
    m = block_mask(anchors, keep, 3, docs, valid)[0].int()
    ctx = [
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
    ]
    own = torch.block_diag(*[torch.ones(3, 3, dtype=torch.int)] * 3)
    expected = torch.cat([torch.tensor(ctx).repeat_interleave(3, 0), own], 1)
    assert torch.equal(m, expected)
    # no leakage: no block sees the features at or after its anchor (those of its labels)
    for j, a in enumerate(anchors[0].tolist()):
        assert not m[3 * j : 3 * j + 3, a:11].any()
    source, counted = block_targets(anchors, keep, 3, loss, pos)
    # block at 4 (doc A ends at 5): x_5 is counted, x_6 is document B's and is not
    assert counted[0].tolist() == [[False, True, True], [False, True, False], [False, True, True]]
    assert source[0].tolist() == [[1, 2, 3], [3, 4, 5], [6, 7, 8]]  # the target's next token at a+k-1
    assert block_positions(anchors, 3, pos)[0].tolist() == [2, 3, 4, 4, 5, 6, 1, 2, 3]
    # a padding block sees its own rows only (no empty softmax row), and counts nothing
    pad = block_mask(anchors, torch.tensor([[True, True, False]]), 3, docs, valid)[0]
    assert not pad[6:, :11].any() and pad[6:, 17:].all()
    assert not block_targets(anchors, torch.tensor([[True, True, False]]), 3, loss, pos)[1][0, 2].any()


def test_anchors_lie_in_answer_spans_per_document_and_ignore_the_batch_layout():
    g = torch.Generator().manual_seed(0)
    lengths = [9, 14, 6, 11]
    masks = [(torch.rand(n, generator=g) < 0.6).long() for n in lengths]
    for m in masks:
        m[0] = 0
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    packed_loss = torch.cat(masks)[None]
    valid = torch.ones_like(pos, dtype=torch.bool)
    docs = documents(valid, pos)
    cand = anchor_candidates(packed_loss, pos)
    seen = torch.zeros_like(cand)
    for seed in range(30):
        torch.manual_seed(seed)
        anchors, keep = sample_anchors(cand, docs, 2, token_uniforms(valid))
        chosen = anchors[keep]
        assert cand[0, chosen].all()  # only where the next token is an answer token of the document
        per_doc = torch.bincount(docs[0, chosen], minlength=len(lengths) + 1)[1:]
        want = torch.bincount(docs[0][cand[0]], minlength=len(lengths) + 1)[1:].clamp(max=2)
        assert torch.equal(per_doc, want)  # min(anchors_per_row, candidates) in every document
        seen[0, chosen] = True
        # the same rows padded one per batch row draw the same anchors
        T = max(lengths)
        pad_loss = torch.stack([F.pad(m, (0, T - len(m))) for m in masks])
        pad_valid = torch.stack([torch.arange(T) < n for n in lengths])
        torch.manual_seed(seed)
        pa, pk = sample_anchors(
            anchor_candidates(pad_loss), documents(pad_valid, None), 2, token_uniforms(pad_valid)
        )
        starts = torch.tensor([0, *lengths]).cumsum(0)[:-1]
        assert sorted((pa + starts[:, None])[pk].tolist()) == chosen.tolist()
    assert torch.equal(seen, cand)  # every candidate gets drawn
    # evaluation takes every candidate once, in passes of bounded width
    passes = chunked_anchors(cand, 3)
    assert torch.cat([a[k] for a, k in passes]).sort().values.tolist() == cand[0].nonzero().flatten().tolist()
    assert all(a.shape[1] <= 3 for a, _ in passes)


def test_decay_weights_and_block_acceptance():
    torch.testing.assert_close(
        block_decay(5, 2.0), torch.tensor([0.0, 1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-1.5)])
    )
    T, F_ = True, False
    # position 0 is the root; a block gains 1 + its run of leading hits
    correct = torch.tensor([[F_, T, T, F_, T], [F_, F_, T, T, T], [F_, T, T, T, T], [F_, T, T, T, T]])
    valid = torch.tensor([[F_, T, T, T, T], [F_, T, T, T, T], [F_, T, T, T, T], [F_, T, T, F_, F_]])
    assert block_acceptance(correct, valid).tolist() == [3, 1, 5, 3]
    # 3 of 4 positions right is 0.75 accuracy, and still no token accepted past the first miss
    assert (correct & valid)[1, 1:].float().mean() == 0.75 and block_acceptance(correct, valid)[1] == 1


def test_dpace_weights_are_the_gradient_of_the_expected_accepted_length():
    """w_k = dE/dlog s_k for E = sum_j prod_{i<=j} s_i over the counted positions."""
    g = torch.Generator().manual_seed(0)
    accept = torch.rand(6, 8, generator=g)
    counted = torch.rand(6, 8, generator=g) > 0.3
    counted[:, 0] = False  # the root predicts nothing
    alpha = 0.3
    log_s = torch.where(counted, ((1 - alpha) * accept + alpha).log(), 0.0).requires_grad_()
    reach = torch.cumprod(log_s.exp(), -1) * counted
    reach.sum().backward()
    torch.testing.assert_close(dpace_weights(accept, counted, alpha), log_s.grad * counted)
    # a drafter sure of every position: position k weighs the counted positions from k on
    sure = dpace_weights(torch.ones(1, 5), torch.tensor([[False, True, True, False, True]]), 0.5)
    assert sure.tolist() == [[0.0, 3.0, 2.0, 0.0, 1.0]]
    # a sure miss at position 1 leaves the rest alpha^j of their weight
    miss = dpace_weights(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([[False, True, True, True]]), 0.5)
    torch.testing.assert_close(miss, torch.tensor([[0.0, 1.5, 1.0, 0.5]]))


def drafter_and_batch(soft: bool):
    model, tok = get_target("llama")
    from draftheads.heads.target.fingerprint import fingerprint

    fp = fingerprint(model, tok)
    torch.manual_seed(0)
    d = DFlashDrafter(fp, model.config.to_dict(), mask_token_id=16, block_size=4).attach(model)
    g = torch.Generator().manual_seed(1)
    pos, loss, valid = packed_row()
    ids = torch.randint(100, 2000, pos.shape, generator=g)
    batch = {"input_ids": ids, "loss_mask": loss, "attention_mask": valid.long(), "position_ids": pos}
    batch["features"] = torch.randn(1, 11, 3 * fp.hidden_size, generator=g)
    if soft:
        batch["topk_ids"] = torch.randint(0, fp.vocab_size, (1, 11, 5), generator=g)
        batch["topk_logits"] = torch.randn(1, 11, 5, generator=g).sort(-1, descending=True).values
    return model, d, batch


@pytest.mark.parametrize("weights", ["decay", "dpace"])
@pytest.mark.parametrize("soft", [False, True], ids=["data-tokens", "topk"])
def test_one_pass_over_all_blocks_equals_each_block_drafted_alone(soft, weights):
    """The objective drafts every block of a packed row in one masked pass; the loss must equal
    each block drafted on its own, from its own document's context before its anchor only, its
    positions weighed by the decay or (dpace) by the reach of the block's chain past them."""
    model, d, batch = drafter_and_batch(soft)
    gamma, alpha = 3.0, 0.25
    cfg = DraftConfig.of(
        kind="dflash", block_size=4, loss_gamma=gamma, position_weights=weights, dpace_alpha=alpha
    )
    obj = DFlashObjective(d, model, cfg, topk=5)
    torch.manual_seed(7)
    loss, stats = obj(batch)
    pos, ids, feats = batch["position_ids"], batch["input_ids"], batch["features"]
    docs = documents(batch["attention_mask"].bool(), pos)
    torch.manual_seed(7)
    anchors, keep = sample_anchors(
        anchor_candidates(batch["loss_mask"], pos), docs, 8, token_uniforms(batch["attention_mask"])
    )
    num, den = torch.zeros(()), torch.zeros(())
    for a in anchors[keep].tolist():
        start = a - int(pos[0, a])
        kv = d.context_kv(feats[:, start:a], pos[:, start:a])
        p = int(pos[0, a]) + torch.arange(4)
        mask = torch.ones(1, 1, 4, a - start + 4, dtype=torch.bool)
        logits = d.logits(d(d.block_inputs(ids[:, a]), p[None], kv, mask))[0]
        ces, reach = {}, []
        for k in range(1, 4):
            j = a + k
            if j >= 11 or not batch["loss_mask"][0, j] or pos[0, j] != pos[0, a] + k:
                continue
            logp = logits[k].log_softmax(-1)
            if soft:
                ce = -(batch["topk_logits"][0, j - 1].softmax(-1) * logp[batch["topk_ids"][0, j - 1]]).sum()
                greedy = batch["topk_ids"][0, j - 1, 0]
            else:
                ce, greedy = -logp[ids[0, j]], ids[0, j]
            s = (1 - alpha) * logp[greedy].exp() + alpha
            reach.append((reach[-1] if reach else 1.0) * s.detach())
            ces[k] = ce
        for i, (k, ce) in enumerate(ces.items()):
            w = math.exp(-(k - 1) / gamma) if weights == "decay" else sum(reach[i:])
            num, den = num + w * ce, den + w
    torch.testing.assert_close(loss, num / den)
    assert stats["pos1/n"] == int(keep.sum())  # every real block counts its first position


def test_a_blind_block_sees_only_its_own_rows():
    pos, loss, valid = packed_row()
    docs = documents(valid, pos)
    anchors, keep = torch.tensor([[2, 4, 7]]), torch.ones(1, 3, dtype=torch.bool)
    sees = torch.tensor([[True, False, True]])
    m = block_mask(anchors, keep, 3, docs, valid, sees)[0]
    full = block_mask(anchors, keep, 3, docs, valid)[0]
    assert not m[3:6, :11].any() and m[3:6, 14:17].all()  # the middle block: its own rows only
    assert torch.equal(m[:3], full[:3]) and torch.equal(m[6:], full[6:])  # the others as before


def test_context_dropout_hides_the_features_from_the_blocks_it_draws():
    """With every block blind the loss does not depend on the target's features; at 0 the
    objective draws no extra random numbers, so a run without the option is unchanged."""
    model, d, batch = drafter_and_batch(True)
    g = torch.Generator().manual_seed(11)
    # other features (not a rescaling: the fused context is RMS-normed)
    scaled = {**batch, "features": batch["features"] + torch.randn(batch["features"].shape, generator=g)}

    def loss(dropout: float, b: dict) -> torch.Tensor:
        cfg = DraftConfig.of(kind="dflash", block_size=4, context_dropout=dropout)
        torch.manual_seed(7)
        return DFlashObjective(d, model, cfg, topk=5)(b)[0]

    assert loss(0.999999, batch) == loss(0.999999, scaled)
    assert loss(0.0, batch) != loss(0.0, scaled)
    torch.manual_seed(7)
    DFlashObjective(d, model, DraftConfig.of(kind="dflash", block_size=4), topk=5)(batch)
    after = torch.get_rng_state()
    torch.manual_seed(7)
    sample_anchors(
        anchor_candidates(batch["loss_mask"], batch["position_ids"]),
        documents(batch["attention_mask"].bool(), batch["position_ids"]),
        8,
        token_uniforms(batch["attention_mask"]),
    )
    assert torch.equal(torch.get_rng_state(), after)
    # the first draft.dflash.blind_steps optimizer steps train every block blind, then the context is back
    early = DFlashObjective(d, model, DraftConfig.of(kind="dflash", block_size=4, blind_steps=2), topk=5)
    assert early(batch, step=1)[0] == early(scaled, step=1)[0]
    assert early(batch, step=2)[0] != early(scaled, step=2)[0]
    with pytest.raises(UserError, match=r"draft.dflash.blind_steps=-1 must be at least 0"):
        DraftConfig.of(kind="dflash", blind_steps=-1)
    for bad in (1.0, -0.1):
        with pytest.raises(UserError, match=rf"draft.dflash.context_dropout={bad} must be in \[0, 1\)"):
            DraftConfig.of(kind="dflash", context_dropout=bad)


def test_chains_give_each_answer_positions_block_acceptance():
    """Evaluation drafts a block at every candidate anchor; τ per block is the decoder's."""
    model, d, batch = drafter_and_batch(soft=True)
    obj = DFlashObjective(d, model, DraftConfig.of(kind="dflash", block_size=4), topk=5)
    correct, valid = obj.chains(batch, depth=3)
    pos, greedy = batch["position_ids"], batch["topk_ids"][0, :, 0]
    candidates = anchor_candidates(batch["loss_mask"], pos)[0].nonzero().flatten().tolist()
    assert correct.shape == valid.shape == (3, len(candidates))
    for col, a in enumerate(candidates):
        start = a - int(pos[0, a])
        kv = d.context_kv(batch["features"][:, start:a], pos[:, start:a])
        p = int(pos[0, a]) + torch.arange(4)
        out = d(
            d.block_inputs(batch["input_ids"][:, a]), p[None], kv, torch.ones(1, 1, 4, a - start + 4).bool()
        )
        pred = d.logits(out)[0].argmax(-1)
        for k in range(1, 4):
            inside = a + k < 11 and bool(batch["loss_mask"][0, a + k]) and pos[0, a + k] == pos[0, a] + k
            assert valid[k - 1, col] == inside
            if inside:
                assert correct[k - 1, col] == (pred[k] == greedy[a + k - 1])


@pytest.mark.parametrize("layers", [1, 2])
def test_logged_flops_are_the_matmuls_autograd_runs_plus_attention(layers):
    """``cost/gflop`` counts forward and backward: torch's FLOP counter sees the linear layers'
    matmuls (attention runs inside SDPA, which it does not count), and the formula's remaining
    term is the dense attention over every key of the row."""
    from torch.utils.flop_counter import FlopCounterMode

    model, d, batch = drafter_and_batch(soft=False)
    d = DFlashDrafter(
        d.target_fingerprint,
        model.config.to_dict(),
        16,
        block_size=4,
        num_decoder_layers=layers,
        draft_vocab_size=512,
    ).attach(model)
    obj = DFlashObjective(d, model, DraftConfig.of(kind="dflash", block_size=4), topk=5)
    torch.manual_seed(0)
    with FlopCounterMode(display=False) as counter:
        loss, stats = obj(batch)
        loss.backward()
    torch.manual_seed(0)
    pos = batch["position_ids"]
    docs = documents(batch["attention_mask"].bool(), pos)
    anchors, _ = sample_anchors(
        anchor_candidates(batch["loss_mask"], pos), docs, 8, token_uniforms(batch["attention_mask"])
    )
    blocks, shape = anchors.numel() * 4, d.layer_shape
    attention = 12 * blocks * layers * (11 + blocks) * shape["num_attention_heads"] * shape["head_dim"]
    assert stats["cost/gflop_sum"] * 1e9 == pytest.approx(counter.get_total_flops() + attention)
    assert stats["cost/n"] == 11


def test_dflash_trains_learns_and_writes_a_loadable_drafter(tmp_path, rows):
    out = train(
        config(tmp_path, *DFLASH, "train.max_steps=24", "train.eval_every=24"), rows, target=tiny_target()
    )
    ls = losses(out)
    assert sum(ls[-3:]) / 3 < 0.97 * sum(ls[:3]) / 3  # it learns
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert d.kind == "dflash" and d.block_size == 4 and d.draft_vocab_size == 512
    assert d.mask_token_id == 16 and d.feature_layers() == [1, 2, 3]
    answer = torch.tensor([t for r in rows for t, m in zip(r["input_ids"], r["loss_mask"]) if m])
    assert d.t2d[torch.bincount(answer).argsort(descending=True)[:20]].all() and d.t2d.sum() == 512
    last = read_metrics(out)
    evals = [r for r in last if "eval/tau" in r][-1]
    assert evals["eval/tau"] >= 1.0 and {f"eval/pos{k}/acc_top1" for k in (1, 2, 3)} <= set(evals)
    assert any("train/block/tau" in r for r in last) and "DFlash" in (out / "README.md").read_text()


def test_dpace_weights_train_from_the_command_line_and_bad_values_are_refused(tmp_path, rows):
    out = train(
        config(tmp_path, *DFLASH, "draft.dflash.position_weights=dpace", "train.max_steps=2"),
        rows,
        target=tiny_target(),
    )
    assert "position_weights: dpace" in (out / "resolved_config.yaml").read_text()
    ls = losses(out)
    assert len(ls) == 2 and all(math.isfinite(x) for x in ls)
    for bad, message in (
        (
            {"position_weights": "linear"},
            r"draft.dflash.position_weights='linear' is unknown; use one of decay, dpace",
        ),
        ({"dpace_alpha": 0.0}, r"draft.dflash.dpace_alpha=0.0 must be in \(0, 1\]"),
    ):
        with pytest.raises(UserError, match=message) as e:
            DraftConfig.of(kind="dflash", **bad)
        assert "\n" not in str(e.value)


def test_kv_heads_widen_the_drafter_layers_through_training_and_export(tmp_path, rows):
    from draftheads.heads.engine.loaders import validate_export
    from draftheads.heads.export import export_drafter

    model, tok = get_target("llama")  # 4 query heads over 2 key/value heads
    out = train(
        config(tmp_path, *DFLASH, "draft.dflash.kv_heads=4", "train.max_steps=1"), rows, target=tiny_target()
    )
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    attn = d.layers[0].self_attn
    assert attn.kv_heads == 4 and attn.v_proj.out_features == 4 * attn.head_dim
    exported = export_drafter(d, "vllm", tmp_path / "vllm")
    assert json.loads((exported / "config.json").read_text())["num_key_value_heads"] == 4
    assert validate_export(exported, "vllm", d.target_fingerprint.num_layers).method == "dflash"
    with pytest.raises(UserError, match=r"draft.dflash.kv_heads=3 does not divide the 4 query heads") as e:
        DFlashDrafter(
            fingerprint(model, tok),
            model.config.to_dict(),
            mask_token_id=16,
            layer_config={"num_key_value_heads": 3},
        )
    assert "\n" not in str(e.value)
    with pytest.raises(
        UserError, match=r"draft.eagle.kv_heads=4 is a key of dflash drafters, and draft.kind=eagle"
    ):
        DraftConfig.of(kind="eagle", kv_heads=4)


def test_zero3_and_gradient_accumulation_train_dflash(tmp_path, rows):
    out = train(config(tmp_path, *DFLASH, "deepspeed=zero3", "train.grad_accum=2", "train.max_steps=2"), rows)
    assert len(losses(out)) == 2 and all(map(math.isfinite, losses(out)))


@pytest.mark.parametrize(
    "dtype", ["target.dtype=bfloat16", "train.precision=bf16"], ids=["bf16-target", "bf16-drafter"]
)
def test_bfloat16_on_either_side_of_the_shared_head_trains(tmp_path, rows, dtype):
    out = train(config(tmp_path, *DFLASH, dtype, "train.max_steps=2", "train.eval_every=2"), rows)
    assert all(map(math.isfinite, losses(out)))


def cache(tmp_path, rows, layers: list[int], topk: int = 0):
    model, tok = get_target("llama")
    directory = tmp_path / f"cache-{'-'.join(map(str, layers))}-{topk}"
    build_feature_cache(model, tok, rows, directory, layers, dtype="float32", topk=topk, show_progress=False)
    return directory


def test_an_eagle3_cache_serves_dflash_with_the_online_loss_and_resumes_exactly(tmp_path, rows):
    """The EAGLE-3 cache (layers 1-4 on the tiny target) serves DFlash's layers 1-3; packed cached
    micro-batches draw the same anchors as padded online ones, so the losses agree."""
    eagle3 = cache(tmp_path, rows, [1, 2, 3, 4])
    common = (*DFLASH, "train.max_steps=4", "train.eval_every=0")
    offline = ("train.features=offline", f"train.feature_cache={eagle3}")
    online = losses(train(config(tmp_path, *common, name="online"), rows, target=tiny_target()))
    straight = losses(train(config(tmp_path, *common, *offline, name="offline"), target=tiny_target()))
    assert straight == pytest.approx(online, abs=1e-4)
    train(
        config(tmp_path, *common, *offline, "train.stop_at=2", "train.save_every=2", name="cut"),
        target=tiny_target(),
    )
    assert losses(train(config(tmp_path, *common, *offline, name="cut"), target=tiny_target())) == straight
    online_cut = config(tmp_path, *common, "train.stop_at=2", "train.save_every=2", name="online-cut")
    train(online_cut, rows, target=tiny_target())
    assert losses(train(config(tmp_path, *common, name="online-cut"), rows, target=tiny_target())) == online


def test_topk_cache_gives_soft_labels(tmp_path, rows):
    topk = cache(tmp_path, rows, [1, 2, 3], topk=8)
    offline = ("train.features=offline", f"train.feature_cache={topk}")
    out = train(
        config(tmp_path, *DFLASH, *offline, "train.max_steps=2", "train.eval_every=2", name="soft"),
        target=tiny_target(),
    )
    assert all(map(math.isfinite, losses(out)))
    with pytest.raises(UserError, match=r"train.soft_labels=full .* DFlash drafter does not read"):
        validate(config(tmp_path, *DFLASH, "train.soft_labels=full"))


def test_a_cache_without_the_drafters_layers_is_refused_in_one_line(tmp_path, rows):
    partial = cache(tmp_path, rows, [1, 2])
    cfg = config(
        tmp_path, *DFLASH, "train.features=offline", f"train.feature_cache={partial}", name="nolayers"
    )
    with pytest.raises(UserError, match=r"holds layers \[1, 2\], not \[3\] that the drafter reads") as e:
        train(cfg, target=tiny_target())
    assert "\n" not in str(e.value) and "draftheads features" in str(e.value)
    release_out_dir(tmp_path / "nolayers")
    assert not (tmp_path / "nolayers").exists()


def test_a_mask_token_that_occurs_in_the_data_is_refused_before_training(tmp_path, rows):
    used = 3  # a special token of the tokenizer, put into one row
    ids = [list(r) for r in rows["input_ids"]]
    ids[3][6] = used
    rows = datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": rows["loss_mask"]})
    cfg = config(tmp_path, *DFLASH, f"draft.dflash.mask_token_id={used}", name="mask")
    with pytest.raises(
        UserError, match=rf"draft.dflash.mask_token_id={used} occurs \d+ time\(s\) in the training rows"
    ) as e:
        train(cfg, rows, target=tiny_target())
    assert "\n" not in str(e.value)
    release_out_dir(tmp_path / "mask")
    assert not (tmp_path / "mask").exists()  # nothing written


def test_dflash_config_composes_and_validates():
    cfg, _ = compose(["draft=dflash", "target=tiny-llama"])
    validate(cfg)
    assert (
        cfg.draft.kind == "dflash"
        and cfg.draft.block_size == 16
        and cfg.draft.training_layers(4) == [1, 2, 3]
    )


def test_a_drafter_cast_to_bfloat16_rotates_by_its_float32_frequencies():
    """The decoder casts the drafter to the target's dtype (and bf16 training casts it too): the
    rotary frequencies stay the float32 ones, so the angles at every position are those an fp32
    training run used, rounded once to bfloat16 as cos/sin, not computed from rounded frequencies."""
    d = dflash("llama")
    freq = d.rotary.inv_freq.clone()
    pos = torch.tensor([[0, 7, 1000, 4000]])
    cos, sin = d.rotary_at(torch.zeros(1, 4, 8), pos)
    for cast in (torch.bfloat16, torch.float16, torch.float32):
        d.to(cast)
        assert d.fc.weight.dtype == cast and d.rotary.inv_freq.dtype == torch.float32
        assert torch.equal(d.rotary.inv_freq, freq) and torch.equal(d.rotary.original_inv_freq, freq)
        c, s = d.rotary_at(torch.zeros(1, 4, 8, dtype=cast), pos)
        assert torch.equal(c, cos.to(cast)) and torch.equal(s, sin.to(cast))
