"""Output folders: no command replaces files it did not write, writes inside a training run, or
shares a folder with another process; eval reports stay with their drafter and push quotes only
those.

The refusals come before any model loads, so these tests run the real commands on tiny targets
and compare a snapshot of the folder before and after.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftheads.conf.cli import main
from draftheads.conf.errors import UserError
from draftheads.heads import MedusaHeads, fingerprint
from tests.conftest import get_target

LOCK = ".draftheads.lock"


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a hash of its content."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def one_line_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0].removeprefix("error: ")


def medusa(path: Path, seed: int = 0) -> Path:
    """A tiny Medusa drafter saved in ``path`` (``seed`` makes its weights differ)."""
    model, tok = get_target("llama")
    torch.manual_seed(seed)
    heads = MedusaHeads(fingerprint(model, tok), num_heads=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return heads.save_pretrained(path)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A user's folder: a README.md and notes, no draftheads output. The working directory is
    ``tmp_path``, so a command that fell back to it would show in the snapshot too."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README.md").write_text("# my project\n")
    (folder / "notes.txt").write_text("keep me\n")
    return folder


SMALL = ["target=tiny-llama", "data.max_rows=2"]
# every command that writes, with the key of its output folder and what else it needs to run tiny
WRITERS = {
    "train": (
        "train.out_dir",
        [*SMALL, "train.max_steps=1", "train.eval_every=0", "draft.medusa.num_heads=1"],
    ),
    "distill": ("data.distill.out_dir", [*SMALL, "data.distill.max_new_tokens=2"]),
    "features": ("data.features.out_dir", SMALL),
    "data": ("out_dir", SMALL),
    "eval": (
        "eval.out_dir",
        ["target=tiny-llama", "heads=none", "eval.max_prompts=1", "decode.max_new_tokens=2", "eval.warmup=0"],
    ),
    "tree": ("out_dir", ["target=tiny-llama", "decode.tree_prompts=1", "decode.tree_new_tokens=2"]),
    "export": ("out_dir", ["target=tiny-llama", "format=vllm"]),
}


def writer_argv(command: str, out: str, heads: Path) -> list[str]:
    key, extra = WRITERS[command]
    extra = [*extra, f"heads={heads}"] if command in ("tree", "export") else extra
    return [command, f"{key}={out}", *extra]


@pytest.mark.parametrize("command", ["train", "distill", "features", "data", "eval", "tree"])
def test_an_empty_out_dir_is_refused_and_nothing_is_written(command, project, tmp_path, capsys):
    heads = medusa(tmp_path / "heads")
    before = snapshot(tmp_path)
    assert main(writer_argv(command, "", heads)) == 1
    key = WRITERS[command][0]
    assert one_line_error(capsys).startswith(f"{key} is empty")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_folder_of_other_files_is_refused_and_left_as_it_was(command, project, tmp_path, capsys):
    heads = medusa(tmp_path / "heads")
    before = snapshot(tmp_path)
    assert main(writer_argv(command, str(project), heads)) == 1
    line = one_line_error(capsys)
    key = WRITERS[command][0]
    assert line.startswith(f"{key}={project} holds other files (README.md, notes.txt)"), line
    assert f"{key}={project / command}" in line  # the fix: a new folder, which the command accepts
    assert snapshot(tmp_path) == before


def fake_run(folder: Path) -> Path:
    """What a training run leaves: metrics and a finished checkpoint under ``checkpoints/``."""
    step = folder / "checkpoints" / "step-0000002"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text('{"files": {}}')
    (folder / "checkpoints" / "latest").write_text("step-0000002\n")
    (folder / "metrics.jsonl").write_text('{"step": 2, "loss": 1.0}\n')
    return folder


@pytest.mark.parametrize(
    "command,inside",
    [
        ("export", "checkpoints"),
        ("data", "checkpoints/step-0000002"),
        ("train", "checkpoints/new"),
        ("distill", "checkpoints/distill"),
        ("features", "checkpoints/step-0000002/features"),
        ("eval", "checkpoints/eval"),
        ("tree", "checkpoints/step-0000002"),
    ],
)
def test_writing_inside_a_training_run_is_refused(command, inside, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = fake_run(tmp_path / "run")
    heads = medusa(tmp_path / "heads")
    before = snapshot(tmp_path)
    assert main(writer_argv(command, str(run / inside), heads)) == 1
    line = one_line_error(capsys)
    assert f"is inside the training run {run}" in line, line
    assert snapshot(tmp_path) == before


def test_a_hand_written_tree_beside_the_heads_is_not_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    heads = medusa(tmp_path / "heads")
    (heads / "tree.json").write_text('{"choices": [[0], [0, 0]]}')
    before = snapshot(tmp_path)
    argv = [
        "tree",
        f"heads={heads}",
        "target=tiny-llama",
        "decode.tree_prompts=1",
        "decode.tree_new_tokens=2",
    ]
    assert main(argv) == 1
    assert "tree.json is not a tree draftheads tree wrote" in one_line_error(capsys)
    assert snapshot(tmp_path) == before


# ---- train: the model card, and one run per folder --------------------------------------------------
def train_config(out: Path, *overrides: str):
    from draftheads.conf.cli import compose

    cfg, _ = compose(
        [
            "target=tiny-llama",
            "draft=medusa",
            "draft.medusa.num_heads=1",
            f"train.output_dir={out}",
            "train.max_steps=1",
            "train.eval_every=0",
            "train.save_every=0",
            "train.eval_rows=2",
            "train.progress=false",
            *overrides,
        ]
    )
    return cfg


@pytest.fixture(scope="module")
def rows():
    from tests.test_train_recipe import make_rows

    return make_rows()


def test_a_readme_the_run_did_not_write_is_never_replaced_by_its_card(tmp_path, rows):
    from draftheads.train.recipe import TrainRecipe, train

    out = train(train_config(tmp_path / "run"), rows)
    assert (out / "README.md").read_text().startswith("---") and not (out / LOCK).exists()
    TrainRecipe(train_config(out, "train.max_steps=2"))  # its own card: the run may continue
    (out / "README.md").write_text("# notes on this run\n")
    before = snapshot(out)
    with pytest.raises(UserError, match="holds a README.md that is not a draftheads model card") as e:
        TrainRecipe(train_config(out, "train.max_steps=2"))
    assert "\n" not in str(e.value) and snapshot(out) == before


@pytest.fixture
def other_process():
    """A live process that is not this one (what a second draftheads run would be)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_training_run_into_a_busy_folder_is_refused_and_a_stale_lock_taken_over(
    tmp_path, rows, other_process, capsys
):
    from draftheads.train.recipe import TrainRecipe, train

    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).write_text(f"{other_process.pid}\n")
    with pytest.raises(
        UserError, match=re.escape(f"train.out_dir={out} is in use by another draftheads process")
    ):
        TrainRecipe(train_config(out))
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing written beside the lock
    other_process.kill()
    other_process.wait()  # it died without releasing the lock
    train(train_config(out), rows)
    err = capsys.readouterr().err
    assert f"taking over the lock of process {other_process.pid}, which is no longer running" in err
    assert (out / "model.safetensors").is_file() and not (out / LOCK).exists()


def test_a_second_distillation_into_a_busy_folder_is_refused(tmp_path, other_process, capsys):
    from draftheads.conf.schema.data import DistillConfig
    from draftheads.data.distill.run import distill
    from draftheads.data.prompts import PromptRow

    model, tok = get_target("llama")
    out = tmp_path / "distill"
    out.mkdir()
    (out / LOCK).write_text(f"{other_process.pid}\n")
    cfg = DistillConfig(out_dir=str(out), max_new_tokens=2, batch_size=2)
    with pytest.raises(UserError, match=r"data.distill.out_dir=.* is in use by another draftheads process"):
        distill(model, tok, [PromptRow("p0", "t", ["Hello"])], cfg, show_progress=False)
    assert sorted(p.name for p in out.iterdir()) == [LOCK]


# ---- eval reports per drafter, and push ---------------------------------------------------------
def test_eval_reports_land_beside_each_drafter_and_record_its_weights(tmp_path, monkeypatch, capsys):
    from draftheads.conf.commands.checks import drafter_digest

    monkeypatch.chdir(tmp_path)
    drafters = [medusa(tmp_path / name, seed) for seed, name in enumerate(("a", "b"))]
    for heads in drafters:
        argv = ["eval", "target=tiny-llama", f"heads={heads}", "eval.max_prompts=1", "eval.baselines=[]"]
        assert main([*argv, "decode.max_new_tokens=4", "eval.warmup=0"]) == 0, capsys.readouterr().err
    for heads in drafters:
        report = json.loads((heads / "eval-heldout" / "report.json").read_text())
        assert report["heads"] == str(heads) and report["drafter_sha256"] == drafter_digest(heads)
    assert not (tmp_path / "outputs").exists()


@pytest.fixture
def hub(monkeypatch, tmp_path):
    from tests.test_hub_fake import serve_hub

    server = serve_hub(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_fakeToken0123456789")
    yield server
    server.__exit__(None, None, None)


def write_report(folder: Path, tau: float, heads: Path, digest: str | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    report = {"tau": tau, "speedup": 1.5, "heads": str(heads), "drafter_sha256": digest}
    (folder / "report.json").write_text(json.dumps(report))


def test_push_quotes_only_a_report_measured_on_that_drafter(hub, tmp_path, capsys):
    from draftheads.conf.commands.checks import drafter_digest

    a, b = medusa(tmp_path / "a", 0), medusa(tmp_path / "b", 1)
    write_report(a / "eval-heldout", 2.71, a, drafter_digest(a))
    write_report(b / "eval-heldout", 3.33, b, drafter_digest(a))  # left from the drafter trained there before
    assert main(["push", f"heads={a}", "repo_id=org/a"]) == 0
    assert main(["push", f"heads={b}", "repo_id=org/b"]) == 0
    files = {name: hub.repos[name].commits[hub.repos[name].branches["main"]] for name in ("org/a", "org/b")}
    assert (
        json.loads(files["org/a"]["report.json"])["tau"] == 2.71
        and "2.71" in files["org/a"]["README.md"].decode()
    )
    assert "report.json" not in files["org/b"] and "3.33" not in files["org/b"]["README.md"].decode()

    write_report(b, 3.33, b, drafter_digest(a))  # in the heads folder itself: push would quote it
    assert main(["push", f"heads={b}", "repo_id=org/b"]) == 1
    assert "report.json was measured on another drafter" in one_line_error(capsys)


def test_data_saves_into_a_new_folder_and_over_its_own_saved_set(tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.chdir(tmp_path)
    argv = ["data", "target=tiny-llama", "data.max_rows=3", "out_dir=rows"]
    assert main(argv) == 0 and main([*argv, "data.max_rows=1"]) == 0, capsys.readouterr().err
    saved = re.findall(r"saved (\d+) rows to rows", capsys.readouterr().out)
    assert len(saved) == 2 and saved[0] != saved[1]  # the second set replaced the first
    assert len(datasets.load_from_disk(str(tmp_path / "rows"))) == int(saved[1])
    assert LOCK not in {p.name for p in (tmp_path / "rows").iterdir()}
