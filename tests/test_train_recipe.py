"""End to end: ``train(cfg)`` on a tiny target for every draft mode and DeepSpeed config,
resume equality, NaN stop, Medusa-2 adapters, wandb offline, and the output directory."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from draftheads.conf.cli import compose
from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.kinds import BUILTIN_KINDS
from draftheads.heads import Drafter
from draftheads.train.metrics import read_metrics
from draftheads.train.recipe import train
from tests.conftest import get_target


@pytest.fixture(scope="module")
def rows():
    return make_rows()


def make_rows():
    """24 rows: a 4-token random prompt, then a random 3-token pattern repeated (the assistant part)."""
    from draftheads.bench.architectures import synthetic_rows

    return synthetic_rows(24)


def config(tmp_path, *overrides: str, name: str = "run"):
    group = next((o.split("=", 1)[1] for o in overrides if o.startswith("draft=")), "medusa")
    kind = next(r.name for r in BUILTIN_KINDS if group in r.groups)
    vocab = [] if kind == "medusa" else [f"draft.{kind}.draft_vocab_size=512"]  # Medusa reads none
    cfg, _ = compose(
        [
            "target=tiny-llama",
            f"train.output_dir={tmp_path / name}",
            "train.max_steps=6",
            "train.warmup_steps=0",
            "train.log_every=1",
            "train.eval_every=3",
            "train.save_every=0",
            "train.eval_rows=4",
            "train.progress=false",
            *vocab,
            *overrides,
        ]
    )
    return cfg


def tiny_target() -> tuple:
    """``target=tiny-llama`` as this process loaded it once: a run trains on it instead of loading
    it again (a quarter of a second each). Runs that could change the target they train on load
    their own: ZeRO-3 partitions the drafter's parameters (the target's lm_head among them where a
    drafter shares it) and Medusa-2 puts its adapters on the target; the wandb run loads its own
    as well, as a command does."""
    return get_target("llama")


def shared_unless_zero3(overrides) -> tuple | None:
    return None if "deepspeed=zero3" in overrides else tiny_target()


def losses(out) -> list[float]:
    return [r["loss"] for r in read_metrics(out) if "loss" in r]


def test_medusa_learns_and_writes_a_loadable_drafter(tmp_path, rows):
    cfg = config(
        tmp_path,
        "draft=medusa",
        "draft.medusa.lm_head=copy",
        "draft.medusa.num_heads=2",
        "train.lr=3e-2",
        "train.max_steps=12",
        "train.eval_every=12",
    )
    out = train(cfg, rows, target=tiny_target())
    ls = losses(out)
    assert sum(ls[-3:]) / 3 < 0.8 * sum(ls[:3]) / 3  # it learns
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "README.md", "resolved_config.yaml", "metrics.jsonl"} <= names
    resolved = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(out / "resolved_config.yaml"))
    assert OmegaConf.to_object(resolved) == cfg  # the resolved config reads back as the run's own
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    conf = json.loads((out / "config.json").read_text())
    assert conf["provenance"]["steps"] == 12 and conf["provenance"]["data"]["rows"] == 22
    assert conf["provenance"]["config"]["draft"]["kind"] == "medusa"
    assert not any("embed" in k or k.startswith("model.") for k in load_file(out / "model.safetensors"))
    last = [r for r in read_metrics(out) if "eval/tau" in r][-1]
    assert last["eval/tau"] >= 1.0 and 0 <= last["eval/head0/acc_top1"] <= 1
    assert d.num_heads == 2 and "Medusa-1" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    "overrides",
    [
        ["draft=eagle", "train.lr=3e-3"],
        ["draft=eagle3", "train.lr=3e-3", "draft.eagle.ttt_steps=2"],
        ["draft=medusa", "draft.medusa.lm_head=copy", "deepspeed=zero2"],
        ["draft=medusa", "draft.medusa.num_heads=2", "deepspeed=zero3", "train.grad_accum=2"],
    ],
    ids=["eagle", "eagle3", "medusa-v1-zero2", "medusa-zero3"],
)
def test_each_mode_trains_a_few_steps(tmp_path, rows, overrides):
    out = train(
        config(tmp_path, *overrides, "train.max_steps=4", "train.eval_every=4"),
        rows,
        target=shared_unless_zero3(overrides),
    )
    ls = losses(out)
    assert len(ls) == 4 and all(torch.isfinite(torch.tensor(ls)))
    model, tok = get_target("llama")
    d = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    if "draft=eagle3" in overrides:
        # The draft vocabulary holds the most frequent assistant tokens of the training rows.
        ids = torch.tensor([t for r in rows for t, m in zip(r["input_ids"], r["loss_mask"]) if m])
        top = torch.bincount(ids).argsort(descending=True)[:20]
        assert d.t2d[top].all() and d.t2d.sum() == 512
        assert "step1/acc_top1" in "".join(read_metrics(out)[-1])


def test_an_offloaded_optimizer_trains_the_drafter_the_in_memory_one_does(tmp_path, rows):
    """``deepspeed=zero2_offload`` steps the same AdamW on the CPU's copy of the optimizer state:
    the run trains (DeepSpeed would refuse our optimizer there unless told it may) and ends on the
    drafter ``deepspeed=zero2`` trains, loss for loss."""
    common = ("draft=eagle", "train.lr=3e-3", "train.max_steps=4", "train.eval_every=0")
    runs = {
        ds: train(config(tmp_path, *common, f"deepspeed={ds}", name=ds), rows, target=tiny_target())
        for ds in ("zero2", "zero2_offload")
    }
    assert losses(runs["zero2_offload"]) == pytest.approx(losses(runs["zero2"]), rel=1e-5)
    a, b = (load_file(out / "model.safetensors") for out in runs.values())
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert len(losses(runs["zero2"])) == 4


def test_resume_reproduces_the_uninterrupted_loss_trajectory(tmp_path, rows):
    common = ("draft=eagle", "train.max_steps=6", "train.lr=3e-3", "train.eval_every=0")
    straight = losses(train(config(tmp_path, *common, name="straight"), rows, target=tiny_target()))
    cut = config(tmp_path, *common, "train.stop_at=3", "train.save_every=3", name="cut")
    out = train(cut, rows, target=tiny_target())
    assert (out / "checkpoints" / "step-0000003").is_dir()
    (out / "checkpoints" / ".partial-step-0000005" / "step-0000005").mkdir(parents=True)  # a killed write
    with pytest.raises(UserError, match="train.resume=auto"):
        train(config(tmp_path, *common, "train.resume=none", name="cut"), rows, target=tiny_target())
    with pytest.raises(UserError, match=r"train.lr=0.003 in the checkpoint, 0.001 now"):
        train(
            config(tmp_path, *common, "train.lr=1e-3", "train.resume=auto", name="cut"),
            rows,
            target=tiny_target(),
        )
    with pytest.raises(UserError, match=r"draft.eagle.num_decoder_layers=1 in the checkpoint, 2 now"):
        train(
            config(tmp_path, *common, "draft.eagle.num_decoder_layers=2", "train.resume=auto", name="cut"),
            rows,
            target=tiny_target(),
        )
    resumed = losses(
        train(config(tmp_path, *common, "train.resume=auto", name="cut"), rows, target=tiny_target())
    )
    assert resumed == straight  # exactly: data order, noise RNG, optimizer and schedule restored
    assert not (out / "checkpoints" / ".partial-step-0000005").exists()


def test_nan_loss_stops_and_names_the_last_good_checkpoint(tmp_path, rows):
    cfg = config(
        tmp_path,
        "draft=medusa",
        "draft.medusa.lm_head=copy",
        "train.lr=1e30",
        "train.grad_clip=0",
        "train.save_every=1",
        "train.max_steps=30",
        "train.eval_every=0",
    )
    with pytest.raises(
        UserError, match=r"loss is (nan|inf) at step \d+; stopped\. the last good checkpoint is .*step-"
    ) as e:
        train(cfg, rows, target=tiny_target())
    assert "\n" not in str(e.value)


def test_medusa2_saves_adapters_and_loads_them_onto_the_target(tmp_path, rows):
    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads.target.load import load_target
    from draftheads.train.adapters import load_adapters

    cfg = config(
        tmp_path,
        "draft=medusa2",
        "train.max_steps=4",
        "train.eval_every=4",
        "draft.medusa.head_warmup_steps=2",
        "draft.medusa.lora_r=4",
    )
    out = train(cfg, rows)
    conf = json.loads((out / "config.json").read_text())
    assert conf["requires_adapters"] is True
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert not any("lora" in k for k in load_file(out / "model.safetensors"))
    rows_m = read_metrics(out)
    assert rows_m[0]["lr/heads"] == pytest.approx(4 * rows_m[0]["lr/lora"])  # head lr multiplier
    assert "train/distill/loss" in rows_m[1]
    target, tok = load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama"))
    drafter = Drafter.from_pretrained(out, target=target, tokenizer=tok)  # puts the adapters on the target
    assert drafter.requires_adapters and getattr(target, "peft_config", None)
    adapted = load_adapters(load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama"))[0], out)
    assert Drafter.from_pretrained(out, target=adapted, tokenizer=tok).requires_adapters


def test_wandb_goes_offline_without_an_api_key(tmp_path, rows, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    out = train(config(tmp_path, "logger=wandb", "train.max_steps=2", "train.eval_every=2"), rows)
    assert list((out / "wandb").glob("offline-run-*"))
