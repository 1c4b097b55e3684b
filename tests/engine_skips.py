"""In CI a skipped engine test is a failure (a pytest hook that tests/conftest.py loads).

The engine tests (marked ``engine``) skip, with the reason, where vLLM's environment is missing:
a developer without ``make engine`` still runs the rest. CI runs ``make engine`` first, so a skip
there means vLLM went missing or broke, and an all-skipped run must not pass: with ``CI`` set to
``true`` (or ``1``) each such skip is reported as a failure that keeps the skip's reason.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    """Whether this run is CI's: ``CI=true`` (or ``1``), as CI services and ``.ci/run`` set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Turn the skip of an ``engine`` test into a failure in CI, naming the skip's reason."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and item.get_closest_marker("engine") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"engine test skipped in CI (CI=true), which must run it: {reason}"
