"""Training objectives, batching, vocabulary and config checks: pure functions, hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from draftheads.conf.cli import compose
from draftheads.conf.errors import UserError
from draftheads.conf.schema.train import validate
from draftheads.heads.masks import causal
from draftheads.train.batching import Layout, StepSampler, collate, split_heldout
from draftheads.train.modules.medusa import medusa_loss
from draftheads.train.objectives import (
    IGNORE,
    chain_acceptance,
    future_labels,
    head_warmup,
    lr_factor,
    shift_left,
)
from draftheads.train.unroll import live_rows, ttt_allowed
from draftheads.train.vocab import draft_vocab, masked_token_counts

X = IGNORE  # no label


def test_medusa_label_shift_matches_a_hand_computed_example():
    # x:    10 11 12 13 14 15   prompt = x0, x1; assistant tokens x2..x5
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    # head 0 at t predicts x_{t+2}; head 1 predicts x_{t+3}
    assert future_labels(ids, mask, 2).tolist() == [[12, 13, 14, 15, X, X]]
    assert future_labels(ids, mask, 3).tolist() == [[13, 14, 15, X, X, X]]
    # a prompt token is never a label: with x3 masked out, head 0 at t=1 has nothing to learn
    mask2 = torch.tensor([[0, 0, 1, 0, 1, 1]])
    assert future_labels(ids, mask2, 2).tolist() == [[12, X, 14, 15, X, X]]
    assert future_labels(ids, mask, 6).tolist() == [[X] * 6]


def test_medusa_loss_weights_heads_by_decay_and_counts_only_masked_tokens():
    torch.manual_seed(0)
    K, T, H, V = 2, 5, 3, 7
    hidden = torch.randn(K, 1, T, H, requires_grad=True)
    proj = torch.randn(H, V)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 1, 1, 1, 1]])
    loss, stats = medusa_loss(hidden, lambda k, h: h @ proj, ids, mask, weight=0.5, decay=0.8)
    ce0 = torch.nn.functional.cross_entropy(hidden[0, 0, :3] @ proj, ids[0, 2:])  # t=0..2 -> x2..x4
    ce1 = torch.nn.functional.cross_entropy(hidden[1, 0, :2] @ proj, ids[0, 3:])  # t=0..1 -> x3..x4
    torch.testing.assert_close(loss, 0.5 * ce0 + 0.5 * 0.8 * ce1)
    assert stats["head0/n"].item() == 3 and stats["head1/n"].item() == 2


def test_empty_loss_mask_gives_zero_loss_with_a_graph_not_nan():
    hidden = torch.randn(2, 1, 4, 3, requires_grad=True)
    loss, _ = medusa_loss(
        hidden,
        lambda k, h: h @ torch.ones(3, 5),
        torch.zeros(1, 4, dtype=torch.long),
        torch.zeros(1, 4, dtype=torch.long),
        1.0,
        0.8,
    )
    assert loss.item() == 0.0 and not math.isnan(loss.item())
    loss.backward()
    assert torch.isfinite(hidden.grad).all()


def test_chain_acceptance_stops_at_the_first_miss():
    correct = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 1, 1]]).bool()  # [S=3, positions=3]
    valid = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]]).bool()
    # position 0: steps 0,1,2 hit -> 1+3; position 1: 0 hits then miss -> 1+1; position 2: miss -> 1
    assert chain_acceptance(correct, valid).tolist() == [4, 2, 1]


def test_ttt_mask_is_causal_then_diagonal():
    every = torch.arange(3)
    m = ttt_allowed(causal(3, torch.device("cpu"))[None], [every] * 3)[0]
    assert m.shape == (3, 9)
    assert m[:, :3].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert m[:, 3:6].tolist() == m[:, 6:].tolist() == torch.eye(3, dtype=torch.bool).tolist()


def test_ttt_mask_of_a_subset_keeps_each_row_on_its_own_keys():
    # step 1 computes rows 1, 2; step 2 row 2 only: its keys are step 0's rows 0..2, then its own
    cols = [torch.arange(3), torch.tensor([1, 2]), torch.tensor([2])]
    m = ttt_allowed(causal(3, torch.device("cpu"))[None], cols)[0]
    assert m.tolist() == [[1, 1, 1, 0, 1, 1]]


def test_live_rows_are_what_a_later_step_still_counts():
    counted = [
        torch.tensor([[1, 0, 0, 1]]).bool(),
        torch.tensor([[0, 1, 0, 0]]).bool(),
        torch.zeros(1, 4).bool(),
    ]
    live = live_rows(counted)
    assert [x.int().tolist() for x in live] == [[[1, 1, 0, 1]], [[0, 1, 0, 0]], [[0, 0, 0, 0]]]


def test_schedules():
    assert head_warmup("sine", 0, 10) == 0.0 and head_warmup("sine", 10, 10) == 1.0
    assert head_warmup("linear", 5, 10) == 0.5 and head_warmup("constant", 0, 10) == 1.0
    assert lr_factor("cosine", 0, 1, 11) == 0.5 and lr_factor("cosine", 11, 1, 11) == pytest.approx(0.0)
    assert lr_factor("linear", 6, 1, 11) == pytest.approx(0.5) and lr_factor("constant", 9, 0, 10) == 1.0
    assert shift_left(torch.tensor([[1, 2, 3]]), 1, -1).tolist() == [[2, 3, -1]]


def test_sampler_is_a_function_of_step_and_ranks_are_disjoint():
    lay0, lay1 = Layout(2, 2, 2, 0), Layout(2, 2, 2, 1)
    s0, s1 = StepSampler(10, 3, lay0), StepSampler(10, 3, lay1)
    seen = s0.indices(0, 0) + s0.indices(0, 1) + s1.indices(0, 0) + s1.indices(0, 1)
    assert len(set(seen)) == 8  # 8 distinct rows in one step of 2 ranks x 2 micro x 2 rows
    assert StepSampler(10, 3, lay0).indices(7, 1) == s0.indices(7, 1)  # no hidden state
    train_idx, held = split_heldout(40, 16, 0)
    assert len(held) == 4 and not set(train_idx) & set(held)


def test_collate_right_pads_and_masks():
    b = collate([{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}, {"input_ids": [4], "loss_mask": [1]}], 0)
    assert b["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


def test_draft_vocab_counts_only_assistant_tokens_and_is_deterministic():
    rows = [{"input_ids": [5, 5, 9, 9, 9, 2], "loss_mask": [0, 1, 1, 1, 1, 0]}]
    counts = masked_token_counts(rows, 12)
    assert counts[9] == 3 and counts[5] == 1 and counts[2] == 0
    assert draft_vocab(counts, 3).tolist() == [0, 5, 9]  # 9, 5, then the lowest unseen id


@pytest.mark.parametrize(
    "override,key",
    [
        ("train.lr=-1", "train.lr"),
        ("train.lr_schedule=cosin", "train.lr_schedule"),
        ("train.micro_batch_size=0", "train.micro_batch_size"),
        ("train.features=offline", "train.feature_cache"),
        ("train.resume=/no/such/dir", "train.resume"),
        ("draft.medusa.head_loss_decay=0", "draft.medusa.head_loss_decay"),
        ("draft.medusa.head_warmup=cos", "draft.medusa.head_warmup"),
        ("logger.mode=sometimes", "logger.mode"),
        ("+deepspeed.gradient_clipping=2", "deepspeed.gradient_clipping"),
        ("deepspeed.zero_optimization.stage=4", "deepspeed.zero_optimization.stage"),
    ],
)
def test_bad_values_fail_before_any_work_naming_the_key(override, key):
    """Refused when the config is read (a drafter key) or validated (the run's settings)."""
    with pytest.raises(UserError, match=key.replace(".", r"\.")) as e:
        validate(compose([override])[0])
    assert "\n" not in str(e.value)


def test_typos_and_wrong_types_fail_at_composition_naming_the_key():
    with pytest.raises(UserError, match="train.lrr"):
        compose(["train.lrr=1"])
    with pytest.raises(UserError, match="train.max_steps"):
        compose(["train.max_steps=many"])


@pytest.mark.parametrize(
    "group,options",
    [
        ("draft", ["medusa", "medusa2", "eagle", "eagle3"]),
        ("train", ["default"]),
        ("deepspeed", ["zero0", "zero2", "zero2_offload", "zero3"]),
        ("logger", ["none", "wandb"]),
    ],
)
def test_every_owned_config_file_composes_and_validates(group, options):
    for opt in options:
        cfg, _ = compose([f"{group}={opt}"])
        validate(cfg)


@pytest.mark.parametrize("version", [1, 3])
def test_eagle_loss_equals_the_per_step_definition(tiny_llama, version):
    """The objective projects each target state once and reuses it across TTT steps; the loss
    must equal the docstring's definition, with the target's logits formed afresh per step."""
    import torch.nn.functional as F

    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.heads import EagleDrafter
    from draftheads.train.modules import EagleObjective
    from draftheads.train.unroll import unroll

    model, _, fp = tiny_llama
    V = fp.vocab_size
    torch.manual_seed(0)
    drafter = EagleDrafter(fp, model.config.to_dict(), version=version, draft_vocab_size=V // 2).attach(model)
    if version == 3:
        drafter.set_vocab(torch.randperm(V)[: V // 2])
    cfg = DraftConfig.of(
        kind="eagle", version=version, ttt_steps=3, feature_loss_weight=0.5, token_loss_weight=1.0
    )
    obj = EagleObjective(drafter, model, cfg, topk=5)
    B, T = 2, 12
    ids = torch.randint(0, V, (B, T))
    mask = torch.zeros(B, T, dtype=torch.long)
    mask[0, 4:] = 1
    mask[1, 6:10] = 1
    batch = {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones(B, T, dtype=torch.long)}
    torch.manual_seed(1)
    loss, _ = obj(batch)

    feats = obj.features(batch)
    inp, final = obj.split(feats)
    outs = unroll(drafter, inp[:, :-1], ids, obj.steps())
    expected = torch.zeros(())
    for s, out in enumerate(outs):
        rows = [(b, t) for b in range(B) for t in range(out.shape[1]) if t + s + 2 < T and mask[b, t + s + 2]]
        o = torch.stack([out[b, t] for b, t in rows])
        f = torch.stack([final[b, t + s + 1] for b, t in rows])
        p = model.lm_head(f)
        counted = torch.ones(len(rows))
        if version == 3:
            vocab = drafter.draft_to_target(torch.arange(drafter.draft_vocab_size))
            counted = drafter.t2d[p.argmax(-1)].float()
            p = p[:, vocab]
        ce = -(p.softmax(-1) * drafter.logits(o).log_softmax(-1)).sum(-1)
        token = (ce * counted).sum() / counted.sum().clamp(min=1)
        feat = F.smooth_l1_loss(o, f, reduction="none").mean(-1).mean()
        expected = expected + cfg.ttt_decay**s * (token + 0.5 * feat)
    torch.testing.assert_close(loss, expected)


def test_resume_config_check_names_the_first_differing_key_and_ignores_free_ones():
    from draftheads.train.checkpoint import config_mismatch

    saved = {
        "target": {"name_or_path": "smollm2", "device": "cpu"},
        "draft": {"kind": "eagle", "feature_layers": [2, 15, 27]},
        "data": {"path": "x", "distill": {"out_dir": "a"}},
        "train": {"lr": 1e-3, "max_steps": 100, "save_every": 10},
        "deepspeed": {"zero_optimization": {"stage": 0}},
    }
    same_run_elsewhere = {
        **saved,
        "target": {"name_or_path": "smollm2", "device": "cuda"},
        "data": {"path": "x", "distill": {"out_dir": "b"}},
        "train": {"lr": 1e-3, "max_steps": 400, "save_every": 50},
    }
    assert config_mismatch(saved, same_run_elsewhere) is None
    other_layers = {**saved, "draft": {"kind": "eagle", "feature_layers": [2, 15, 28]}}
    assert (
        config_mismatch(saved, other_layers)
        == "draft.eagle.feature_layers=[2, 15, 27] in the checkpoint, [2, 15, 28] now"
    )
    zero2 = {**saved, "deepspeed": {"zero_optimization": {"stage": 2}}}
    assert config_mismatch(saved, zero2) == "deepspeed.zero_optimization.stage=0 in the checkpoint, 2 now"
