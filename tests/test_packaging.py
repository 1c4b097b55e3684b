"""The install declares every folder it ships, so setuptools has nothing to warn about."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_folder_is_a_declared_package():
    """A folder of .py or .yaml files left out of `packages` is what setuptools warns about, once
    per folder, on every install (and it would not be installed from a wheel)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(tool["packages"])
    dirs = {pkg: ROOT / folder for pkg, folder in tool["package-dir"].items()}
    shipped = set()
    for pkg, folder in dirs.items():
        for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            if "__pycache__" in sub.parts or not any(sub.glob("*.py")) and not any(sub.glob("*.yaml")):
                continue
            shipped.add(".".join([pkg, *sub.relative_to(folder).parts]))
    assert shipped == declared, (shipped - declared, declared - shipped)
    assert set(tool["package-dir"]) <= declared
