"""Packed rows: several documents in one row must train exactly as if each were alone.

The target and the drafter see per-document positions and block-diagonal attention, and no
label crosses a document boundary.
"""

from __future__ import annotations

import torch

from draftheads.heads import EagleDrafter
from draftheads.heads.features import target_features
from draftheads.heads.masks import packed_causal
from draftheads.train.batching import collate
from draftheads.train.objectives import IGNORE, future_labels, label_mask
from draftheads.train.unroll import unroll

POS = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])  # three documents: 3, 2 and 4 tokens


def test_packed_causal_is_block_diagonal_and_respects_padding():
    allowed = packed_causal(POS)[0]
    assert allowed[4].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert allowed[8].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    padded = packed_causal(torch.tensor([[0, 1, 2, 0]]), torch.tensor([[1, 1, 0, 0]]))[0]
    assert padded[2].tolist() == [1, 1, 1, 0]  # a padded query still sees itself
    assert padded[1].tolist() == [1, 1, 0, 0]


def test_labels_never_cross_a_document_boundary():
    ids = torch.arange(10, 19)[None]
    mask = torch.ones_like(ids)
    assert future_labels(ids, mask, 2, POS).tolist() == [[12, X, X, X, X, 17, 18, X, X]]
    assert future_labels(ids, mask, 2).tolist() == [[12, 13, 14, 15, 16, 17, 18, X, X]]
    assert label_mask(mask, 1, POS).tolist() == [[1, 1, 0, 1, 0, 1, 1, 1, 0]]


X = IGNORE


def test_packed_features_and_drafter_outputs_equal_each_document_alone(tiny_llama):
    model, _, fp = tiny_llama
    torch.manual_seed(0)
    docs = [torch.randint(3, fp.vocab_size, (n,)) for n in (5, 3, 6)]
    packed = collate(
        [
            {
                "input_ids": torch.cat(docs).tolist(),
                "loss_mask": [1] * 14,
                "position_ids": [p for d in docs for p in range(len(d))],
            }
        ],
        pad_id=0,
    )
    layers = [1, fp.num_layers]
    f_packed, _ = target_features(
        model, packed["input_ids"], packed["attention_mask"], layers, position_ids=packed["position_ids"]
    )
    drafter = EagleDrafter(fp, model.config.to_dict(), version=1).attach(model)
    H = fp.hidden_size
    out_packed = unroll(drafter, f_packed[:, :-1, H:], packed["input_ids"], 2, packed["position_ids"])
    start = 0
    for d in docs:
        n = len(d)
        f_alone, _ = target_features(model, d[None], torch.ones(1, n, dtype=torch.long), layers)
        torch.testing.assert_close(f_packed[0, start : start + n], f_alone[0], atol=1e-5, rtol=1e-4)
        out_alone = unroll(drafter, f_alone[:, :-1, H:], d[None], 2)
        for s in range(2):
            # rows whose step-s inputs stay inside the document: t + s + 1 < n
            keep = n - 1 - s
            torch.testing.assert_close(
                out_packed[s][0, start : start + keep], out_alone[s][0, :keep], atol=1e-5, rtol=1e-4
            )
        start += n


def test_packed_rows_give_the_loss_of_the_same_documents_unpacked(tiny_llama):
    """Every objective averages over counted positions, so one packed row of four documents
    must give the loss of a batch holding the four documents as separate rows."""
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.heads import MedusaHeads
    from draftheads.train.modules import EagleObjective, MedusaObjective

    model, _, fp = tiny_llama
    g = torch.Generator().manual_seed(3)
    docs = []
    for n, prompt in ((7, 2), (5, 3), (9, 4), (6, 2)):
        ids = torch.randint(3, fp.vocab_size, (n,), generator=g).tolist()
        docs.append({"input_ids": ids, "loss_mask": [0] * prompt + [1] * (n - prompt)})
    unpacked = collate(docs, pad_id=0)
    packed = collate(
        [
            {
                "input_ids": [t for d in docs for t in d["input_ids"]],
                "loss_mask": [m for d in docs for m in d["loss_mask"]],
                "position_ids": [p for d in docs for p in range(len(d["input_ids"]))],
            }
        ],
        pad_id=0,
    )
    torch.manual_seed(0)
    medusa = MedusaObjective(MedusaHeads(fp, num_heads=3).attach(model), model, DraftConfig(), topk=5)
    eagle_cfg = DraftConfig.of(kind="eagle", version=3, ttt_steps=3, draft_vocab_size=fp.vocab_size)
    eagle3 = EagleDrafter(fp, model.config.to_dict(), version=3, draft_vocab_size=fp.vocab_size).attach(model)
    eagle = EagleObjective(eagle3, model, eagle_cfg, topk=5)
    for objective in (medusa, eagle):
        loss_unpacked, stats_unpacked = objective(unpacked)
        loss_packed, stats_packed = objective(packed)
        torch.testing.assert_close(loss_packed, loss_unpacked, atol=1e-5, rtol=1e-4)
        assert {k: v.item() for k, v in stats_packed.items() if k.endswith("/n")} == {
            k: v.item() for k, v in stats_unpacked.items() if k.endswith("/n")
        }


def test_training_keeps_the_position_ids_of_packed_rows(tmp_path):
    from draftheads.conf.cli import compose
    from draftheads.train.recipe import TrainRecipe

    cfg, _ = compose(["target=tiny-llama", "draft=eagle3", f"train.output_dir={tmp_path}"])
    row = {
        "input_ids": [5, 6, 7, 8],
        "loss_mask": [0, 1, 0, 1],
        "position_ids": [0, 1, 0, 1],
        "source": "a+b",
    }
    rows, tokens = TrainRecipe(cfg, [row]).load_rows()
    assert rows == tokens == [{k: row[k] for k in ("input_ids", "loss_mask", "position_ids")}]


def cached_rows(fp, lengths: list[tuple[int, int]], k: int = 4, seed: int = 5) -> list[dict]:
    """Rows as a feature cache gives them: tokens, a prompt-then-answer loss mask, EAGLE-3's
    four layers of features and the target's top-k logits (sorted, descending)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n, prompt in lengths:
        logits = torch.randn(n, k, generator=g).sort(-1, descending=True).values
        rows.append(
            {
                "input_ids": torch.randint(3, fp.vocab_size, (n,), generator=g).tolist(),
                "loss_mask": [0] * prompt + [1] * (n - prompt),
                "features": torch.randn(n, 4 * fp.hidden_size, generator=g),
                "topk_ids": torch.randint(3, fp.vocab_size, (n, k), generator=g),
                "topk_logits": logits,
            }
        )
    return rows


def test_a_packed_micro_batch_trains_like_the_padded_one(tiny_llama):
    """``collate_packed`` puts the rows end to end with per-row positions: the EAGLE-3 loss from
    cached features and top-k labels, its counts and every gradient equal the padded batch's."""
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.train.batching import collate_packed
    from draftheads.train.modules import EagleObjective

    model, _, fp = tiny_llama
    rows = cached_rows(fp, [(9, 3), (4, 1), (12, 7), (6, 2)])
    packed = collate_packed(rows)
    assert packed["input_ids"].shape == (1, 31) and packed["features"].shape == (1, 31, 4 * fp.hidden_size)
    assert packed["position_ids"][0, 9:14].tolist() == [0, 1, 2, 3, 0]
    torch.manual_seed(0)
    cfg = DraftConfig.of(kind="eagle", version=3, ttt_steps=3, draft_vocab_size=fp.vocab_size)
    drafter = EagleDrafter(fp, model.config.to_dict(), version=3, draft_vocab_size=fp.vocab_size).attach(
        model
    )
    objective = EagleObjective(drafter, model, cfg, topk=5)
    results = []
    for batch in (collate(rows, pad_id=0), packed):
        drafter.zero_grad()
        loss, stats = objective(batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}
        results.append((loss.detach(), {k: v.item() for k, v in stats.items() if k.endswith("/n")}, grads))
    (loss_a, n_a, g_a), (loss_b, n_b, g_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=1e-4)
    assert n_a == n_b and n_a["step2/n"] > 0
    assert g_a.keys() == g_b.keys() and len(g_a) > 5
    for name in g_a:
        torch.testing.assert_close(g_b[name], g_a[name], atol=1e-5, rtol=1e-3, msg=name)


def test_later_steps_compute_only_the_rows_a_loss_still_reads(tiny_llama):
    """Step s > 0 runs on the rows some step >= s counts; their outputs equal the full unroll's."""
    model, _, fp = tiny_llama
    torch.manual_seed(0)
    drafter = EagleDrafter(fp, model.config.to_dict(), version=3, draft_vocab_size=fp.vocab_size).attach(
        model
    )
    T = 14
    ids = torch.randint(3, fp.vocab_size, (1, T))
    pos = torch.tensor([[*range(8), *range(6)]])  # two documents: 8 and 6 tokens
    feats = torch.randn(1, T - 1, 3 * fp.hidden_size)
    loss_mask = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1]])
    counted = [label_mask(loss_mask, s + 2, pos) for s in range(3)]
    seen = []
    hook = drafter.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    subset = unroll(drafter, feats, ids, 3, pos, counted)
    hook.remove()
    full = unroll(drafter, feats, ids, 3, pos)
    # counted rows: step 0 -> 3, 4, 5, 10, 11; step 1 -> 2, 3, 4, 9, 10; step 2 -> 1, 2, 3, 8, 9
    assert [c[0, : T - 1].nonzero().flatten().tolist() for c in counted] == [
        [3, 4, 5, 10, 11],
        [2, 3, 4, 9, 10],
        [1, 2, 3, 8, 9],
    ]
    assert seen == [13, 7, 5]  # every row; then those counted at step 1 or 2; then those at step 2
    for s in range(3):
        rows = counted[s][0, : T - 1]
        torch.testing.assert_close(subset[s][0, rows], full[s][0, rows], atol=1e-5, rtol=1e-4)
    assert (subset[2][0, ~counted[2][0, : T - 1]] == 0).all()  # rows no step computed read 0
