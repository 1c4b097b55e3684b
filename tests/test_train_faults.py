"""Faults around a training run: Ctrl-C, a torn metrics line, a damaged checkpoint, crafted
pickles in a checkpoint, an unusable output directory, and a finished run of another drafter."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.train import checkpoint
from draftheads.train.metrics import read_metrics
from draftheads.train.recipe import TrainRecipe, train
from tests.test_train_recipe import config, losses, make_rows, tiny_target

EAGLE = ("draft=eagle", "train.lr=3e-3", "train.eval_every=0")


@pytest.fixture(scope="module")
def rows():
    return make_rows()


class Touch:
    """Unpickling this creates ``path``: proof that a loader executed a pickle."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def interrupt_after(step: int):
    def hook(recipe) -> None:
        if recipe.step == step:
            raise KeyboardInterrupt

    return hook


def steps(out) -> list[int]:
    return [r["step"] for r in read_metrics(out)]


def test_ctrl_c_without_save_every_saves_and_the_same_command_resumes_exactly(tmp_path, rows, capsys):
    straight = read_metrics(
        train(config(tmp_path, *EAGLE, "train.max_steps=5", name="straight"), rows, target=tiny_target())
    )
    cfg = config(tmp_path, *EAGLE, "train.max_steps=5", name="cut")  # train.save_every=0
    with pytest.raises(KeyboardInterrupt):
        train(cfg, rows, hooks=[interrupt_after(3)], target=tiny_target())
    out = tmp_path / "cut"
    assert [p.name for p in checkpoint.complete_checkpoints(out / "checkpoints")] == ["step-0000003"]
    assert "interrupted: steps 1-3 saved" in capsys.readouterr().err
    resumed = read_metrics(train(cfg, rows, target=tiny_target()))  # the same command
    assert steps(out) == [1, 2, 3, 4, 5]  # no duplicated rows
    for key in ("loss", "grad_norm", "train/step0/loss"):
        assert [r[key] for r in resumed] == [r[key] for r in straight]


def test_resume_skips_a_torn_metrics_line_and_a_damaged_checkpoint_and_unpickles_nothing(
    tmp_path, rows, capsys
):
    common = (*EAGLE, "train.max_steps=6", "train.save_every=2")
    straight = losses(train(config(tmp_path, *common, name="straight"), rows, target=tiny_target()))
    out = train(config(tmp_path, *common, "train.stop_at=4", name="cut"), rows, target=tiny_target())
    ckpts = out / "checkpoints"
    assert [p.name for p in checkpoint.complete_checkpoints(ckpts)] == ["step-0000002", "step-0000004"]
    victim = next((ckpts / "step-0000004").rglob("*model_states.pt"))
    victim.write_bytes(victim.read_bytes()[:-64] + b"\0" * 64)  # damaged in place, same size
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')  # killed mid-write
    marker = tmp_path / "executed"
    (ckpts / "step-0000002" / "rng-rank0.pt").write_bytes(pickle.dumps(Touch(marker)))
    with pytest.raises(UserError, match=r"step-0000004 is damaged \(.*model_states.pt does not match"):
        train(
            config(tmp_path, *common, f"train.resume={ckpts / 'step-0000004'}", name="cut"),
            rows,
            target=tiny_target(),
        )
    resumed = losses(train(config(tmp_path, *common, name="cut"), rows, target=tiny_target()))
    err = capsys.readouterr().err
    assert "skipping damaged checkpoint(s) step-0000004 (" in err and "resuming from step-0000002" in err
    assert resumed == straight and steps(out) == [1, 2, 3, 4, 5, 6]
    assert not marker.exists()

    # A crafted pickle in place of DeepSpeed's model states, with a matching manifest: never
    # executed. Named, it is refused in one whole line whose advice works; train.resume=auto
    # resumes from the intact checkpoint before it, as for other damage.
    latest = checkpoint.latest_checkpoint(ckpts)
    states = next(latest.rglob("*model_states.pt"))
    torch.save({"module": Touch(marker)}, states)
    checkpoint.write_manifest(latest)
    with pytest.raises(UserError) as e:
        train(
            config(tmp_path, *common, "train.max_steps=8", f"train.resume={latest}", name="cut"),
            rows,
            target=tiny_target(),
        )
    line = str(e.value)
    assert (
        f"{latest} is not a readable training checkpoint (it holds pickled objects other than tensors" in line
    )
    assert line.endswith("or start fresh with another train.out_dir") and "train.resume=none" not in line
    assert "\n" not in line and not marker.exists()
    capsys.readouterr()
    train(config(tmp_path, *common, "train.max_steps=8", name="cut"), rows, target=tiny_target())
    err = capsys.readouterr().err
    assert f"skipping unreadable checkpoint(s) {latest.name} (it holds pickled objects" in err
    assert "resuming from step-0000004" in err and steps(out) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert not marker.exists()


def test_rng_state_round_trips_through_safetensors(tmp_path):
    import random

    random.random()
    state = checkpoint.rng_state()
    checkpoint.save_rng(state, tmp_path / "rng.safetensors")
    expected = (torch.rand(3), random.random())
    checkpoint.set_rng_state(checkpoint.load_rng(tmp_path / "rng.safetensors"))
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_no_pickle_loading_in_train():
    source = "".join(p.read_text() for p in Path(checkpoint.__file__).parent.glob("*.py"))
    assert "weights_only=False" not in source and "pickle.load" not in source


@pytest.mark.parametrize("kind", ["proc", "file"])
def test_an_unusable_output_directory_is_one_line_before_any_work(tmp_path, kind):
    path = Path("/proc/draftheads-out") if kind == "proc" else tmp_path / "a-file"
    if kind == "file":
        path.write_text("keep me")
    with pytest.raises(UserError, match=r"train.out_dir=.* (is an existing file|cannot be written)") as e:
        TrainRecipe(config(tmp_path, name=str(path)))
    assert "\n" not in str(e.value)
    assert kind == "proc" or path.read_text() == "keep me"


def test_a_finished_run_of_another_drafter_is_refused_and_nothing_changes(tmp_path, rows):
    medusa = ("draft=medusa", "draft.medusa.num_heads=1", "train.max_steps=1", "train.eval_every=0")
    out = train(config(tmp_path, *medusa), rows, target=tiny_target())
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=r"holds a finished drafter of another run \(draft\.") as e:
        train(config(tmp_path, *EAGLE, "train.max_steps=1"), rows, target=tiny_target())
    assert "\n" not in str(e.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
