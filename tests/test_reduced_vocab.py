"""The reduced draft vocabulary shared by EAGLE-3 and DFlash: the d2t/t2d maps, their checks,
and the head over the draft ids."""

from __future__ import annotations

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.heads.dflash import DFlashDrafter
from draftheads.heads.eagle import EagleDrafter
from draftheads.heads.reduced_vocab import (
    check_draft_vocab_size,
    check_vocab_maps,
    frozen_rows,
    t2d_from_d2t,
)


def drafters(model, fp, draft_vocab: int | None) -> list:
    """An EAGLE-3 and a DFlash drafter of ``model`` with the same draft vocabulary size, attached."""
    cfg = model.config.to_dict()
    eagle = EagleDrafter(fp, target_config=cfg, version=3, draft_vocab_size=draft_vocab)
    dflash = DFlashDrafter(fp, cfg, mask_token_id=5, block_size=4, draft_vocab_size=draft_vocab)
    return [eagle.attach(model), dflash.attach(model)]


def test_set_vocab_sorts_and_the_maps_agree(tiny_llama):
    model, _, fp = tiny_llama
    ids = torch.tensor([40, 7, 300, 2, 99])
    for d in drafters(model, fp, draft_vocab=5):
        d.set_vocab(ids)
        assert d.target_ids().tolist() == [2, 7, 40, 99, 300]
        assert d.draft_to_target(torch.tensor([[0, 4], [2, 1]])).tolist() == [[2, 300], [40, 7]]
        assert torch.equal(d.t2d, t2d_from_d2t(d.d2t, fp.vocab_size))
        assert int(d.t2d.sum()) == 5 and bool(d.t2d[ids].all())
        check_vocab_maps(d.d2t, d.t2d, fp.vocab_size, "test")
        with pytest.raises(UserError, match="has 4 ids, expected 5"):
            d.set_vocab(ids[:4])


def test_full_vocabulary_maps(tiny_llama):
    """DFlash at the full size drafts with the target's own head: no map. EAGLE-3's own head is
    in d2t's order at any size, so a permuted map (an imported checkpoint's) still applies."""
    model, _, fp = tiny_llama
    eagle, dflash = drafters(model, fp, draft_vocab=None)
    ids = torch.arange(6)
    assert not dflash.reduced_vocab and dflash.head() is model.get_output_embeddings()
    with torch.no_grad():
        dflash.d2t[0] = 3
        eagle.d2t[0] = 3
    assert torch.equal(dflash.draft_to_target(ids), ids)
    assert eagle.draft_to_target(ids)[0] == 3


def test_reduced_heads_are_the_target_rows(tiny_llama):
    model, _, fp = tiny_llama
    eagle, dflash = drafters(model, fp, draft_vocab=16)
    ids = torch.arange(1, 49, 3)
    weight = model.get_output_embeddings().weight
    x = torch.randn(2, 3, fp.hidden_size)
    for d in (eagle, dflash):
        d.set_vocab(ids)
    eagle.init_lm_head_from_target()
    assert torch.equal(eagle.lm_head.weight, weight[ids])
    assert torch.allclose(dflash.logits(x), x @ weight[ids].T, atol=1e-6)
    first = dflash.head()
    dflash.set_vocab(ids + 1)  # a new vocabulary rebuilds the frozen head
    assert dflash.head() is not first and torch.equal(dflash.head().weight, weight[ids + 1])


def test_frozen_rows_is_frozen_and_draws_nothing():
    weight = torch.randn(10, 4)
    ids = torch.tensor([1, 5, 9])
    state = torch.get_rng_state()
    with torch.inference_mode():
        head = frozen_rows(weight, ids)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(head.weight, weight[ids]) and not head.weight.requires_grad
    assert not head.weight.is_inference()


def test_checks_refuse_bad_sizes_and_corrupt_maps():
    assert check_draft_vocab_size(8, 10, "eagle") == 8
    for size in (0, 11):
        with pytest.raises(UserError, match=f"draft.dflash.draft_vocab_size={size} must be between 1 and"):
            check_draft_vocab_size(size, 10, "dflash")
    d2t = torch.tensor([0, 1, 1])  # ids 0, 2, 3
    check_vocab_maps(d2t, t2d_from_d2t(d2t, 6), 6, "ok")
    with pytest.raises(UserError, match="outside the target vocabulary or twice"):
        check_vocab_maps(torch.tensor([0, 0, -1]), torch.zeros(6, dtype=torch.bool), 6, "dup")
    with pytest.raises(UserError, match="outside the target vocabulary"):
        check_vocab_maps(torch.tensor([0, 1, 5]), torch.zeros(6, dtype=torch.bool), 6, "range")
    with pytest.raises(UserError, match="t2d disagrees with d2t"):
        check_vocab_maps(d2t, torch.ones(6, dtype=torch.bool), 6, "t2d")
