"""Drafter folders given to export and to training: an export of another drafter or in another
format is never replaced, a refusal names the format that works, a speculators EAGLE-3 given to
start P-EAGLE from gets the command-line step, and weight files follow the umask."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftheads.conf.cli import main
from tests.test_bad_input import one_line_error, snapshot


@pytest.fixture
def two_drafters(tmp_path, monkeypatch, tiny_llama) -> Path:
    """A working folder with an EAGLE-3 drafter ``e3`` and a DFlash drafter ``df`` for tiny-llama."""
    from draftheads.heads import DFlashDrafter, EagleDrafter

    model, _, fp = tiny_llama
    monkeypatch.chdir(tmp_path)
    EagleDrafter(fp, model.config.to_dict(), version=3, feature_layers=[1, 2, 3]).save_pretrained(
        tmp_path / "e3"
    )
    DFlashDrafter(
        fp, target_config=model.config.to_dict(), mask_token_id=0, block_size=4, feature_layers=[1, 2]
    ).save_pretrained(tmp_path / "df")
    return tmp_path


def test_an_export_of_another_drafter_is_never_replaced(two_drafters, capsys):
    spec = ["format=speculators", "out_dir=spec", "target=tiny-llama"]
    assert main(["export", "heads=e3", *spec]) == 0
    assert main(["export", "heads=./e3", *spec]) == 0  # the same drafter refreshes its export
    capsys.readouterr()
    before = snapshot(two_drafters)
    assert main(["export", "heads=df", *spec]) == 1
    line = one_line_error(capsys)
    assert "out_dir=spec holds the export of another drafter" in line and "e3" in line, line
    assert snapshot(two_drafters) == before


def test_an_export_in_another_format_is_never_replaced(two_drafters, capsys):
    assert main(["export", "heads=e3", "format=vllm", "out_dir=x", "target=tiny-llama"]) == 0
    capsys.readouterr()
    before = snapshot(two_drafters)
    assert main(["export", "heads=e3", "format=sglang", "out_dir=x", "target=tiny-llama"]) == 1
    line = one_line_error(capsys)
    assert "out_dir=x holds the format=vllm export" in line and "format=sglang would replace" in line, line
    assert snapshot(two_drafters) == before
    assert main(["export", "heads=e3", "format=vllm", "out_dir=x", "target=tiny-llama"]) == 0  # refreshed


@pytest.mark.parametrize("fc_bias,works", [(True, "format=sglang"), (False, "format=vllm")])
def test_the_format_an_eagle1_refusal_names_exports_it(two_drafters, tiny_llama, capsys, fc_bias, works):
    from tests.test_export import eagle

    model, _, fp = tiny_llama
    eagle(model, fp, 1, fc_bias=fc_bias).save_pretrained(two_drafters / "e1")
    assert main(["export", "heads=e1", "format=speculators", "out_dir=x", "target=tiny-llama"]) == 1
    line = one_line_error(capsys)
    assert f"export it with {works}" in line, line
    assert main(["export", "heads=e1", works, "out_dir=x", "target=tiny-llama"]) == 0


def test_a_speculators_eagle3_to_start_peagle_from_gets_a_cli_step(two_drafters, capsys):
    assert main(["export", "heads=e3", "format=speculators", "out_dir=spec", "target=tiny-llama"]) == 0
    capsys.readouterr()
    before = snapshot(two_drafters)
    run = [
        "train.out_dir=run",
        "data.max_rows=4",
        "train.max_steps=1",
        "train.eval_every=0",
        "target=tiny-llama",
    ]
    assert main(["train", "draft=peagle", "draft.peagle.init_from_eagle3=spec", *run]) == 1
    line = one_line_error(capsys)
    assert "draft.peagle.init_from_eagle3=spec is a speculators eagle-3 checkpoint" in line, line
    assert "`draftheads train draft=eagle3 train.out_dir=DIR`" in line and "from_pretrained" not in line, line
    assert snapshot(two_drafters) == before


def test_weight_files_follow_the_umask(two_drafters, tiny_llama):
    import os
    import stat

    from draftheads.heads import Drafter
    from draftheads.train.checkpoint import rng_state, save_rng

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    old = os.umask(0o022)
    try:
        Drafter.from_pretrained(two_drafters / "e3").save_pretrained(two_drafters / "again")
        for fmt in ("vllm", "sglang", "speculators"):
            assert main(["export", "heads=e3", f"format={fmt}", f"out_dir={fmt}", "target=tiny-llama"]) == 0
        save_rng(rng_state(), two_drafters / "rng.safetensors")
        written = [two_drafters / d / "model.safetensors" for d in ("again", "vllm", "sglang", "speculators")]
        assert {mode(f) for f in [*written, two_drafters / "rng.safetensors"]} == {0o644}
        os.umask(0o077)
        Drafter.from_pretrained(two_drafters / "e3").save_pretrained(two_drafters / "private")
        assert mode(two_drafters / "private" / "model.safetensors") == 0o600
    finally:
        os.umask(old)
