"""P-EAGLE through the real recipe: ``draft=peagle`` trains a few steps on the tiny target, saves a
drafter that loads back as the same P-EAGLE drafter, evaluates every depth of its group, and
refuses settings it cannot train in one line before anything is written."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest
import torch

from draftheads.conf.cli import compose, main
from draftheads.conf.errors import UserError
from draftheads.heads import Drafter, MedusaHeads, PEagleDrafter, fingerprint
from draftheads.heads.peagle.from_eagle3 import start_from_eagle3
from draftheads.train.drafters import build_drafter
from draftheads.train.metrics import read_metrics
from draftheads.train.recipe import train
from tests.conftest import get_target
from tests.test_recipes import figure
from tests.test_train_recipe import config, losses, make_rows, tiny_target

PEAGLE = ("draft=peagle", "draft.peagle.num_depths=3", "train.lr=1e-2")


@pytest.fixture(scope="module")
def rows():
    return make_rows()


def test_peagle_trains_saves_and_loads_through_the_recipe(tmp_path, rows):
    out = train(
        config(tmp_path, *PEAGLE, "train.max_steps=4", "train.eval_every=4"), rows, target=tiny_target()
    )
    ls = losses(out)
    assert len(ls) == 4 and all(torch.isfinite(torch.tensor(ls)))
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert isinstance(d, PEagleDrafter) and d.num_depths == 3 and d.draft_vocab_size == 512
    assert d.mask_token_id == 16 and not d.own_embedding  # the tokenizer's unused special token
    # the mask row starts as the target's and trains; every other row is the target's own
    emb = model.get_input_embeddings().weight
    assert not torch.equal(d.mask_embed, emb[16]) and torch.equal(d.input_embedding()[:16], emb[:16])
    evals = [r for r in read_metrics(out) if "eval/tau" in r][-1]
    assert {f"eval/depth{k}/acc_top1" for k in range(3)} <= set(evals)
    assert "P-EAGLE" in (out / "README.md").read_text()


def test_own_embedding_trains_a_copy_of_the_whole_table(tmp_path, rows):
    out = train(
        config(tmp_path, *PEAGLE, "draft.peagle.own_embedding=true", "train.max_steps=2"),
        rows,
        target=tiny_target(),
    )
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert d.own_embedding and not torch.equal(d.embed_tokens.weight, model.get_input_embeddings().weight)


@pytest.mark.parametrize(
    "override, match",
    [
        ("draft.peagle.num_depths=99", "draft.peagle.num_depths=99: a P-EAGLE group drafts 1 to 32"),
        ("draft.peagle.num_depths=0", "draft.peagle.num_depths=0: a P-EAGLE group drafts 1 to 32"),
        ("draft.peagle.down_sample_ratio=0", r"draft.peagle.down_sample_ratio=0.0 must be in \(0, 1\]"),
        ("draft.peagle.max_anchors=0", "draft.peagle.max_anchors=0 must be at least 1"),
        ("draft.peagle.feature_layers=[1,2]", "EAGLE-3 reads 3 target layer"),
        (
            "draft.eagle.ttt_steps=3",
            "draft.eagle.ttt_steps=3 is a key of eagle drafters.*use draft.peagle.num_depths=3",
        ),
        ("draft.dflash.block_size=4", "use draft.peagle.num_depths=4"),
    ],
)
def test_bad_settings_are_refused_when_the_config_is_read(override, match):
    with pytest.raises(UserError, match=match) as err:
        compose(["draft=peagle", "target=tiny-llama", override])
    assert "\n" not in str(err.value)


def test_a_group_deeper_than_every_answer_or_a_text_token_as_mask_is_refused_before_training(tmp_path, rows):
    with pytest.raises(UserError, match="draft.peagle.num_depths=30 is more than the longest answer") as err:
        train(
            config(tmp_path, "draft=peagle", "draft.peagle.num_depths=30", name="deep"),
            rows,
            target=tiny_target(),
        )
    assert "\n" not in str(err.value) and not (tmp_path / "deep" / "model.safetensors").exists()
    with pytest.raises(UserError, match="draft.peagle.mask_token_id=100 is the ordinary text token") as err:
        train(
            config(tmp_path, *PEAGLE, "draft.peagle.mask_token_id=100", name="mask"),
            rows,
            target=tiny_target(),
        )
    assert "\n" not in str(err.value) and not (tmp_path / "mask" / "model.safetensors").exists()


def test_a_target_whose_features_it_cannot_read_is_refused_in_one_line(tmp_path, rows):
    """The tiny target has 4 layers: a feature layer past its final state cannot be read."""
    with pytest.raises(UserError, match=r"draft.peagle.feature_layers=\[1, 2, 7\]") as err:
        train(
            config(tmp_path, *PEAGLE, "draft.peagle.feature_layers=[1,2,7]", name="far"),
            rows,
            target=tiny_target(),
        )
    assert "\n" not in str(err.value) and not (tmp_path / "far" / "model.safetensors").exists()


def test_the_dry_run_sizes_a_peagle_recipe_from_the_kind_registry():
    """Llama-3.1-8B's EAGLE-3 recipe with draft=peagle: the drafter is EAGLE-3's plus the mask
    feature (3H) and the mask token's row (H), and its queries are the kept group entries."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(
            [
                "train",
                "recipe=llama3.1-8b-eagle3",
                "draft=peagle",
                "draft.eagle=null",  # the recipe's EAGLE-3 section, which a P-EAGLE drafter does not read
                "draft.peagle.draft_vocab_size=32000",
                "train.dry_run=true",
            ]
        )
    text = out.getvalue()
    assert code == 0, text
    assert "dry run of recipe llama3.1-8b-eagle3: P-EAGLE (8 per pass)" in text
    H, A, KV, M, Vd = 4096, 32 * 128, 8 * 128, 14336, 32000
    eagle3 = 3 * H * H + 2 * H * A + 2 * (2 * H * KV) + A * H + 3 * H * M + 2 * H + 2 * H + H * Vd
    assert figure(text, "drafter parameters") == figure(text, "trainable parameters") == eagle3 + 4 * H
    assert figure(text, "FLOPs per token") > 0 and figure(text, "activations per rank") > 0


@pytest.fixture(scope="module")
def eagle3_run(tmp_path_factory, rows):
    """A tiny EAGLE-3 drafter trained on the same rows (its draft vocabulary is then P-EAGLE's)."""
    return train(
        config(tmp_path_factory.mktemp("eagle3"), "draft=eagle3", "train.max_steps=2"),
        rows,
        target=tiny_target(),
    )


def test_a_start_from_eagle3_copies_its_tensors_so_depth_0_drafts_as_eagle3(eagle3_run):
    """P-EAGLE's depth 0 is EAGLE-3's first step exactly, so after the start both give the same logits."""
    model, tok = get_target("llama")
    eagle = Drafter.from_pretrained(eagle3_run, target=model, tokenizer=tok)
    cfg = compose(
        [
            "draft=peagle",
            "target=tiny-llama",
            "draft.peagle.num_depths=3",
            "draft.peagle.draft_vocab_size=512",
        ]
    )[0]
    peagle = build_drafter(cfg, model, tok)
    left = start_from_eagle3(peagle, str(eagle3_run))
    assert left == ["mask_embed", "mask_hidden"]
    ours = peagle.state_dict()
    for k, v in eagle.state_dict().items():
        assert torch.equal(ours[k], v), k
    torch.manual_seed(0)
    feats = torch.randn(1, 5, eagle.fc.in_features)
    ids = torch.randint(0, 200, (1, 5))
    one = eagle.fuse(feats)
    assert torch.equal(peagle.fuse(feats), one) and torch.equal(peagle.embed(ids), eagle.embed(ids))


def test_a_start_from_eagle3_trains_from_its_weights_through_the_recipe(tmp_path, rows, eagle3_run):
    out = train(
        config(
            tmp_path,
            *PEAGLE[:2],
            "train.lr=1e-9",
            "train.max_steps=1",
            f"draft.peagle.init_from_eagle3={eagle3_run}",
        ),
        rows,
        target=tiny_target(),
    )
    model, tok = get_target("llama")
    started = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    eagle = Drafter.from_pretrained(eagle3_run, target=model, tokenizer=tok)
    assert torch.allclose(started.fc.weight, eagle.fc.weight, atol=1e-6)
    assert torch.equal(started.d2t, eagle.d2t)


@pytest.mark.parametrize(
    "source, extra, match",
    [
        ("medusa", [], "is a medusa drafter, not EAGLE-3; give a drafter trained with draft=eagle3"),
        (
            "eagle3",
            ["draft.peagle.draft_vocab_size=256"],
            "has draft_vocab_size=512 but this P-EAGLE drafter 256; set draft.peagle.draft_vocab_size=512",
        ),
        ("eagle3", ["draft.peagle.fc_norm=true"], "has fc_norm=False; set draft.peagle.fc_norm=false"),
        ("missing", [], "no such checkpoint directory"),
    ],
)
def test_a_start_from_another_drafter_is_refused_before_training(
    tmp_path, rows, eagle3_run, source, extra, match
):
    if source == "medusa":
        model, tok = get_target("llama")
        path = MedusaHeads(fingerprint(model, tok), num_heads=2).save_pretrained(tmp_path / "medusa")
    else:
        path = eagle3_run if source == "eagle3" else tmp_path / "nowhere"
    with pytest.raises(UserError, match=match) as err:
        train(
            config(tmp_path, *PEAGLE, *extra, f"draft.peagle.init_from_eagle3={path}", name="start"),
            rows,
            target=tiny_target(),
        )
    assert "\n" not in str(err.value) and not (tmp_path / "start" / "model.safetensors").exists()
