"""bench/gpu_check.py runs as is from a checkout with only torch and transformers importable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"

# What a bare GPU machine lacks: this project's other dependencies, its other subpackages, and
# the installed (editable) draftheads itself. ``sys.modules[name] = None`` makes importing
# ``name`` fail and ``importlib.util.find_spec(name)`` return None, as for a missing package.
BARE_MACHINE = """
import runpy, sys
for name in ("hydra", "omegaconf", "datasets", "deepspeed", "peft", "wandb", "gguf", "matplotlib",
             "draftheads.train", "draftheads.data", "draftheads.bench"):
    sys.modules[name] = None
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    import draftheads
    print("draftheads from", draftheads.__file__)
"""


def run_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BARE_MACHINE, str(SCRIPT), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_gpu_check_runs_on_cpu_with_only_torch_and_transformers(tmp_path):
    proc = run_check(tmp_path, "--device", "cpu", "--small")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for section in (
        "== verify-cost curve ==",
        "== drafting cost ==",
        "== greedy identity",
        "== decoder overhead ==",
    ):
        assert out.count(section) == 2, (section, out)  # one per target shape
    assert "EAGLE-3 draft pass" in out and "Medusa step (4 heads" in out
    for n in (1, 64):
        assert any(line.split()[:1] == [str(n)] for line in out.splitlines())
    identity = [line.split() for line in out.splitlines() if "/2 = " in line]
    backends = {(row[0], row[1]) for row in identity}
    assert backends == {(b, d) for b in ("eager", "static") for d in ("eagle3+lookup", "lookup")}
    assert all(row[4] == "1.00" and row[5] == "1.000" for row in identity)  # float32: exact
    assert sum(line.strip().startswith(("eager ", "static ")) for line in out.splitlines()) == 2 * 6
    assert "draftheads-gpu-check-" in out.splitlines()[-1]  # the checkout, not the installed package


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_gpu_check_without_cuda_says_how_to_run_on_cpu(tmp_path):
    proc = run_check(tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: no CUDA device here; run with --device cpu --small for the CPU check"
    )
