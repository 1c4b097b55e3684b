"""Imports flow one way and without cycles (the contracts in pyproject.toml, checked by import-linter)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lint(config: Path) -> int:
    """import-linter's exit code for ``config`` (0: every contract kept); no cache written."""
    from importlinter.cli import lint_imports

    return lint_imports(config_filename=str(config), no_cache=True)


def test_imports_follow_the_layers(capsys):
    code = lint(ROOT / "pyproject.toml")
    assert code == 0, capsys.readouterr().out[-3000:]


def test_the_checker_sees_an_upward_import(tmp_path, capsys):
    """The same packages with two layers swapped: the CLI's import of the errors is then upward."""
    text = (ROOT / "pyproject.toml").read_text()
    contract = re.search(r"\[\[tool\.importlinter\.contracts\]\].*", text, re.S).group(0)
    contract = contract[: contract.index("\n[tool.ruff]")]
    swapped = '[[tool.importlinter.contracts]]\nname = "swapped"\ntype = "layers"\n'
    swapped += 'layers = ["draftheads.conf.errors", "draftheads.conf.cli"]\n'
    config = tmp_path / "pyproject.toml"
    config.write_text(text.replace(contract, swapped))
    assert lint(config) == 1
    assert "draftheads.conf.cli is not allowed to import draftheads.conf.errors" in capsys.readouterr().out
