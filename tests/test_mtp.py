"""MTP heads (``draft=mtp``): FastMTP's step weights, the head's first weights (the target's last
layer behind a pass-through fc), its loss, training through the recipe into a drafter that reloads
as the same MTP head, greedy decoding identical to the target's own ``generate``, the export in
EAGLE-1's layout that reads back as the same weights, and bad settings refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.cli import compose
from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.conf.schema.heads import DraftConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.proposers import EagleProposer, build_proposer
from draftheads.heads import Drafter, EagleDrafter, fingerprint
from draftheads.heads.export import export_drafter
from draftheads.heads.mtp import MTPDrafter
from draftheads.heads.target.layers import decoder_layers
from draftheads.train.drafters import build_objective
from draftheads.train.metrics import read_metrics
from draftheads.train.modules.mtp import step_weights
from draftheads.train.recipe import train
from tests.conftest import get_target
from tests.test_decode import PROMPTS, OracleGenerator, check_rows, reference
from tests.test_train_recipe import losses, make_rows, tiny_target

K = 3


def mtp_config(tmp_path, *overrides: str):
    cfg, _ = compose(
        [
            "target=tiny-llama",
            "draft=mtp",
            f"train.output_dir={tmp_path / 'run'}",
            "train.max_steps=4",
            "train.warmup_steps=0",
            "train.eval_every=4",
            "train.save_every=0",
            "train.eval_rows=4",
            "train.log_every=1",
            "train.progress=false",
            "train.lr=1e-3",
            *overrides,
        ]
    )
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(folder, drafter as trained): ``draft=mtp`` trained 4 steps through the recipe on the tiny Llama."""
    folder = train(mtp_config(tmp_path_factory.mktemp("mtp")), make_rows(), target=tiny_target())
    model, tok = get_target("llama")
    return folder, Drafter.from_pretrained(folder, target=model, tokenizer=tok)


def fresh(seed: int = 0) -> MTPDrafter:
    """An untrained MTP head for the tiny Llama, its layer started as the target's last."""
    model, tok = get_target("llama")
    torch.manual_seed(seed)
    d = MTPDrafter(fingerprint(model, tok), model.config.to_dict(), num_speculative_steps=K).attach(model)
    d.init_from_target(model)
    return d


def test_step_weights_are_fastmtps_normalised_decay():
    """alpha_k = beta**k / sum_j beta**j, speculators' own compute_step_weights."""
    from speculators.models.mtp.core import compute_step_weights

    total = 1 + 0.6 + 0.36
    assert step_weights(0.6, 3) == pytest.approx([1 / total, 0.6 / total, 0.36 / total], abs=1e-15)
    for beta, steps in ((0.6, 3), (0.8, 5), (1.0, 4), (0.3, 1)):
        assert step_weights(beta, steps) == pytest.approx(compute_step_weights(beta, steps), abs=1e-15)
        assert sum(step_weights(beta, steps)) == pytest.approx(1.0)
    assert step_weights(1.0, 4) == [0.25] * 4


def test_the_untrained_head_is_the_targets_last_layer_behind_a_passthrough_fc():
    model, _ = get_target("llama")
    d = fresh()
    H = d.target_fingerprint.hidden_size
    assert d.fc.bias is None and torch.equal(d.fc.weight, torch.cat([torch.zeros(H, H), torch.eye(H)], 1))
    e, h = torch.randn(2, 5, H), torch.randn(2, 5, H)
    assert torch.equal(d.fc(torch.cat([e, h], -1)), h)
    theirs = decoder_layers(model)[-1].state_dict()
    mine = d.layers[0].state_dict()
    assert "input_layernorm.weight" not in mine  # vLLM's EAGLE-1 layer 0 has none
    assert mine.keys() == {k for k in theirs if not k.startswith("input_layernorm.")}
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert d.training_layers() == d.feature_layers() == [d.target_fingerprint.num_layers]


def test_the_loss_is_the_weighted_sum_of_each_steps_token_loss():
    """The objective's loss is sum_k alpha_k * (step k's mean soft cross-entropy), with the steps'
    own stats, and no feature regression."""
    from draftheads.bench.architectures import synthetic_rows

    model, _ = get_target("llama")
    d = fresh()
    rows = synthetic_rows(3)
    T = min(len(r) for r in rows["input_ids"])
    batch = {
        "input_ids": torch.tensor([r[:T] for r in rows["input_ids"]]),
        "loss_mask": torch.tensor([r[:T] for r in rows["loss_mask"]]),
    }
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    cfg = DraftConfig.of(kind="mtp", num_speculative_steps=K, step_weight_decay=0.5)
    loss, stats = build_objective(d, model, cfg, topk=5)(batch)
    per_step = [stats[f"step{k}/loss_sum"] / stats[f"step{k}/n"] for k in range(K)]
    want = sum(a * s for a, s in zip(step_weights(0.5, K), per_step))
    torch.testing.assert_close(loss, want)
    assert all(stats[f"step{k}/n"] > 0 for k in range(K)) and "step0/feature_sum" not in stats


def test_mtp_trains_saves_and_reloads_as_the_same_head(trained, tmp_path):
    folder, d = trained
    ls = losses(folder)
    assert len(ls) == 4 and all(torch.isfinite(torch.tensor(ls)))
    conf = json.loads((folder / "config.json").read_text())
    assert conf["kind"] == "mtp" and conf["spec"]["num_speculative_steps"] == K
    assert type(d) is MTPDrafter and d.num_speculative_steps == K and d.num_decoder_layers == 1
    evals = [r for r in read_metrics(folder) if "eval/tau" in r][-1]
    assert {f"eval/step{k}/acc_top1" for k in range(K)} <= set(evals)
    assert "an MTP head" in (folder / "README.md").read_text()
    # it trained: the layer moved away from the target's last layer, fc away from [0 | I]
    start = fresh()
    assert not torch.equal(d.fc.weight, start.fc.weight)
    # saved again and reloaded: the same kind, arguments and tensors
    again = Drafter.from_pretrained(d.save_pretrained(tmp_path / "again"))
    assert type(again) is MTPDrafter and again.spec() == d.spec()
    sa, sb = again.state_dict(), d.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("tree", ["chain3", "auto"])
def test_greedy_output_is_the_targets(trained, tree):
    model, tok = get_target("llama")
    _, d = trained
    assert isinstance(build_proposer(d, None, DecodeConfig(lookup=False)), EagleProposer)
    for cost_aware, backend in ((False, "eager"), (True, "onednn")):
        cfg = DecodeConfig(tree=tree, cost_aware=cost_aware, lookup=False, backend=backend)
        gen = SpeculativeGenerator(model, d, tok, cfg)
        for prompts in (PROMPTS[:1], PROMPTS[1:4]):  # one row; a left-padded batch of three
            check_rows("llama", gen, prompts, new=12)


def test_oracle_drafts_are_accepted_and_output_is_still_the_targets():
    """Drafts made right by an oracle are accepted in runs of every length along the chain."""
    model, tok = get_target("llama")
    prompts = PROMPTS[:3]
    cont = [reference("llama", p, 30) for p in prompts]
    plen = [len(tok(p).input_ids) for p in prompts]
    cfg = DecodeConfig(tree="chain3", cost_aware=False, lookup=False)
    gen = OracleGenerator(model, fresh(), tok, cfg, continuations=cont, prompt_lens=plen)
    check_rows("llama", gen, prompts, new=30)
    assert gen.last_stats.tau > 1.5 and len(set(gen.last_stats.accepted_lengths)) >= 3


def test_the_export_is_eagle1s_layout_and_reads_back_as_the_same_weights(trained, tmp_path):
    model, tok = get_target("llama")
    _, d = trained
    vllm = export_drafter(d, "vllm", tmp_path / "vllm")
    config = json.loads((vllm / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    back = Drafter.from_pretrained(vllm, target=model, tokenizer=tok)
    assert type(back) is EagleDrafter and back.version == 1 and not back.fc_bias
    sa, sb = back.state_dict(), d.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # the engine's drafter is this one: the same logits on the same input
    ids, h = torch.tensor([[5, 6, 7]]), torch.randn(1, 3, d.target_fingerprint.hidden_size)
    pos = torch.arange(3)[None]
    torch.testing.assert_close(back.logits(back(ids, h, pos)), d.logits(d(ids, h, pos)), rtol=0, atol=0)
    sglang = export_drafter(d, "sglang", tmp_path / "sglang")
    from safetensors.torch import load_file

    assert torch.equal(
        load_file(str(sglang / "model.safetensors"))["fc.bias"], torch.zeros(d.fc.out_features)
    )
    with pytest.raises(UserError, match="export it with format=vllm or format=sglang") as e:
        export_drafter(d, "speculators", tmp_path / "spec")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "override, match",
    [
        (
            "draft.mtp.num_decoder_layers=2",
            "draft.mtp.num_decoder_layers=2: an MTP head is one decoder layer",
        ),
        ("draft.mtp.num_speculative_steps=0", "draft.mtp.num_speculative_steps=0 must be at least 1"),
        ("draft.mtp.step_weight_decay=0", r"draft.mtp.step_weight_decay=0.0 must be in \(0, 1\]"),
        ("draft.mtp.step_weight_decay=1.5", r"draft.mtp.step_weight_decay=1.5 must be in \(0, 1\]"),
        (
            "draft.eagle.ttt_steps=4",
            "draft.eagle.ttt_steps=4 is a key of eagle drafters.*use draft.mtp.num_speculative_steps=4",
        ),
        ("draft.eagle.feature_loss_weight=0.5", r"drop it \(draft=eagle or draft=eagle3 reads it\)"),
    ],
)
def test_bad_settings_are_refused_when_the_config_is_read(override, match):
    with pytest.raises(UserError, match=match) as err:
        compose(["draft=mtp", "target=tiny-llama", override])
    assert "\n" not in str(err.value)
