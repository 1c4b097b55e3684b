"""The install declares every folder it ships, so setuptools has nothing to warn about, and the lab
(bench/lab/: the maintainers' study, probes and GPU check) stays out of it."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
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
    lab = lab_folders(tool)
    for pkg, folder in dirs.items():
        for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            if (
                "__pycache__" in sub.parts
                or sub in lab
                or not any(sub.glob("*.py"))
                and not any(sub.glob("*.yaml"))
            ):
                continue
            shipped.add(".".join([pkg, *sub.relative_to(folder).parts]))
    assert shipped == declared, (shipped - declared, declared - shipped)
    assert set(tool["package-dir"]) <= declared


def lab_folders(tool: dict) -> set[Path]:
    """The folders under the installed packages' directories that ``packages`` leaves out on
    purpose: bench/lab/ and everything in it (the maintainers' tools, run from a checkout)."""
    lab = ROOT / "bench" / "lab"
    return {lab, *(p for p in lab.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)}


def test_the_lab_is_left_out_of_packages_and_no_installed_module_imports_it():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(tool["packages"])
    assert not any(p == "draftheads.bench.lab" or p.startswith("draftheads.bench.lab.") for p in declared)
    assert any((ROOT / "bench" / "lab").glob("*.py"))  # the lab is there, beside the installed bench
    for folder in tool["package-dir"].values():
        for path in (ROOT / folder).rglob("*.py"):
            if any(path.is_relative_to(lab) for lab in lab_folders(tool)):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom):
                    names = [f"{'.' * node.level}{node.module or ''}"]
                assert not any(re.match(r"(draftheads\.)?bench\.lab\b|\.+lab\b", n) for n in names), (
                    path,
                    names,
                )


def test_a_built_wheel_holds_the_installed_packages_and_not_the_lab(tmp_path):
    """What lands in site-packages: the wheel of a copy of the sources, built offline."""
    src = tmp_path / "src"
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in tool["package-dir"].values():
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*command, "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("draftheads-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "draftheads/bench/pipeline.py" in names and "draftheads/bench/extension.py" in names
    assert not [n for n in names if "/lab/" in n or "/gpu/" in n or n.startswith("bench/")]
    assert {n.split("/")[0] for n in names} == {"draftheads", wheel.name.split("-py3")[0] + ".dist-info"}
    assert any(n.startswith("draftheads/conf/draft/") for n in names)  # the config groups' YAML files
