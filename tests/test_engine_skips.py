"""CI fails on a skipped engine test; a developer's run without vLLM skips it with the reason.

Each case runs pytest in a child process on a small engine-marked test file that skips as the
engine tests do when vLLM's environment is missing, with the hook of tests/engine_skips.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ENGINE_TESTS = """
import pytest

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", autouse=True)
def needs_engine():
    pytest.skip("no vLLM environment at .venv-engine; run make engine")


def test_served():
    pass


@pytest.mark.skipif(True, reason="vLLM cannot serve this kind")
def test_other():
    pass
"""


def run_pytest(folder: Path, ci: str | None) -> subprocess.CompletedProcess:
    """pytest on ``folder`` with the CI hook, ``CI`` set to ``ci`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    # the hook alone: loading every installed plugin was most of a run
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if ci is not None:
        env["CI"] = ci
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "tests.engine_skips", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*argv, str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def engine_tests(tmp_path) -> Path:
    (tmp_path / "test_fake_engine.py").write_text(ENGINE_TESTS)
    return tmp_path


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_skipped_engine_test_fails_with_its_reason(engine_tests, ci):
    done = run_pytest(engine_tests, ci)
    assert done.returncode == 1, done.stdout + done.stderr
    # a skip in setup (a fixture, a skipif mark) reports as an error of the setup: not a pass
    assert "2 errors" in done.stdout and "engine test skipped in CI" in done.stdout, done.stdout
    assert "run make engine" in done.stdout and "vLLM cannot serve this kind" in done.stdout, done.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_a_missing_engine_is_a_skip_with_its_reason(engine_tests, ci):
    done = run_pytest(engine_tests, ci)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 skipped" in done.stdout and "run make engine" in done.stdout, done.stdout


def test_in_ci_other_skips_stay_skips(tmp_path):
    (tmp_path / "test_plain.py").write_text("import pytest\n\ndef test_x():\n    pytest.skip('no GPU')\n")
    done = run_pytest(tmp_path, "true")
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout + done.stderr
