"""The command line: help, resolved config, and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from draftheads.conf.cli import main
from draftheads.heads import MedusaHeads


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "draftheads.conf.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "info" in out and "config groups" in out


def test_cfg_job_prints_the_resolved_config(capsys):
    assert main(["train", "draft=eagle3", "train.lr=3e-4", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert "version: 3" in out and "lr: 0.0003" in out and "out_dir:" in out and "output_dir" not in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (["train", "train.lrr=1"], "unknown config key train.lrr"),
        (["train", "train.lr=abc"], "bad value for train.lr"),
        (["train", "draft=nope"], "draft=nope is not a draft option; use one of "),
        (["info", "draft=eagle"], "info does not read draft; it reads target, heads, revision"),
        (["info", "heads=/nonexistent/dir"], "no such checkpoint directory"),
        (["info"], "needs heads=DIR"),
        (["frobnicate"], "unknown command"),
    ],
)
def test_user_errors_are_one_line(args, needle):
    p = run(*args)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert err and needle in err[-1] and err[-1].startswith("error:"), p.stderr
    assert "Traceback" not in p.stderr


def test_info_prints_kind_shapes_and_fingerprint(tmp_path, tiny_llama, capsys):
    model, tok, fp = tiny_llama
    MedusaHeads(fp, num_heads=2, num_layers=1).save_pretrained(tmp_path)
    assert main(["info", f"heads={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "kind: medusa" in out and '"num_heads": 2' in out and fp.tokenizer_hash in out
    assert "blocks.1.0.linear.weight" in out and "(64, 64)" in out
