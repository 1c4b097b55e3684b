"""The command line: help, resolved config, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from draftheads.conf.cli import main
from draftheads.heads import MedusaHeads

# Each case runs as ``python -m draftheads.conf.cli ARGS`` runs it (the module as __main__, its
# stderr at the file descriptor, an uncaught exception printed as Python prints it), all cases in
# one fresh interpreter: its imports cost seconds, paid once instead of once per case.
BATCH = """
import json, os, runpy, sys, tempfile, traceback
results = []
for args in json.loads(sys.argv[1]):
    sys.argv = ["draftheads.conf.cli", *args]
    with tempfile.TemporaryFile("w+") as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            runpy.run_module("draftheads.conf.cli", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        results.append([code, err.read()])
print(json.dumps(results))
"""


def run_all(cases: list[list[str]]) -> dict[tuple[str, ...], tuple[int, str]]:
    """``args -> (exit code, stderr)`` of ``python -m draftheads.conf.cli args`` for each case."""
    p = subprocess.run(
        [sys.executable, "-c", BATCH, json.dumps(cases)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(p.stdout.strip().splitlines()[-1])
    return {tuple(args): (code, err) for args, (code, err) in zip(cases, results)}


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "info" in out and "config groups" in out


def test_cfg_job_prints_the_resolved_config(capsys):
    assert main(["train", "draft=eagle3", "train.lr=3e-4", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert "version: 3" in out and "lr: 0.0003" in out and "out_dir:" in out and "output_dir" not in out


USER_ERRORS = [
    (["train", "train.lrr=1"], "unknown config key train.lrr"),
    (["train", "train.lr=abc"], "bad value for train.lr"),
    (["train", "draft=nope"], "draft=nope is not a draft option; use one of "),
    (["info", "draft=eagle"], "info does not read draft; it reads target, heads, revision"),
    (["info", "heads=/nonexistent/dir"], "no such checkpoint directory"),
    (["info"], "needs heads=DIR"),
    (["frobnicate"], "unknown command"),
]


@pytest.fixture(scope="module")
def user_errors() -> dict[tuple[str, ...], tuple[int, str]]:
    return run_all([args for args, _ in USER_ERRORS])


@pytest.mark.parametrize("args,needle", USER_ERRORS)
def test_user_errors_are_one_line(args, needle, user_errors):
    code, stderr = user_errors[tuple(args)]
    assert code != 0
    err = stderr.strip().splitlines()
    assert err and needle in err[-1] and err[-1].startswith("error:"), stderr
    assert "Traceback" not in stderr


def test_info_prints_kind_shapes_and_fingerprint(tmp_path, tiny_llama, capsys):
    model, tok, fp = tiny_llama
    MedusaHeads(fp, num_heads=2, num_layers=1).save_pretrained(tmp_path)
    assert main(["info", f"heads={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "kind: medusa" in out and '"num_heads": 2' in out and fp.tokenizer_hash in out
    assert "blocks.1.0.linear.weight" in out and "(64, 64)" in out
