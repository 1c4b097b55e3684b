"""The package layout: moved modules answer their old paths, and no generic module switches on a kind.

A kind's facts live in its own files (``heads/<kind>/``, ``train/modules/<kind>.py``,
``decode/proposers/<kind>.py``, ``conf/schema/kinds/<kind>.py``); everything else asks the
registry. The scan below finds a comparison with a kind's name or an ``isinstance`` on a kind's
drafter class anywhere else in the installed package.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from draftheads.conf.moved import MOVED
from draftheads.heads.kinds import KINDS

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = ("conf", "heads", "decode", "train", "data", "bench")


def test_every_old_module_path_is_the_moved_module_with_a_warning():
    """In a fresh interpreter (nothing imported yet): each old path is the very module, and its
    warning names the new home."""
    code = (
        "import importlib, json, sys, warnings\n"
        "from draftheads.conf.moved import MOVED\n"
        "said = {}\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    assert module is importlib.import_module(new), (old, module)\n"
        "    said[old] = [str(x.message) for x in w if x.category is DeprecationWarning]\n"
        "print(json.dumps(said))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said == {old: [f"{old} moved to {new}; import it from there"] for old, new in MOVED.items()}


def test_a_package_that_took_a_module_name_answers_its_names():
    from draftheads.data.cache import FeatureCache
    from draftheads.data.cache.read import FeatureCache as read
    from draftheads.heads.target import load_target
    from draftheads.heads.target.load import load_target as loaded

    assert FeatureCache is read and load_target is loaded
    assert (
        importlib.import_module("draftheads.train.dry_run").run
        is importlib.import_module("draftheads.train.dry_run.main").run
    )
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        importlib.import_module("draftheads.data.distill").no_such_name  # noqa: B018


def kind_switches(source: str, names: set[str], classes: set[str]) -> list[str]:
    """Comparisons with a kind's name and ``isinstance`` checks on a kind's drafter class in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            parts += [e for p in parts if isinstance(p, (ast.Tuple, ast.List, ast.Set)) for e in p.elts]
            if any(isinstance(p, ast.Constant) and p.value in names for p in parts):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "isinstance"
            and len(node.args) == 2
        ):
            named = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node.args[1])}
            if named & classes:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def own_file(path: Path, kinds: set[str]) -> bool:
    """A kind's own file: its folder under heads/, or a module named after it in a registry package."""
    parts = path.relative_to(ROOT).parts
    if parts[0] == "heads" and len(parts) > 2 and parts[1] in kinds:
        return True
    registries = {("train", "modules"), ("decode", "proposers"), ("conf", "schema", "kinds")}
    return tuple(parts[:-1]) in registries and path.stem in kinds


def test_no_generic_module_switches_on_a_kind():
    kinds = set(KINDS)
    names = kinds | {"eagle1", "eagle3", "eagle-1", "eagle-3"}
    classes = {k.drafter.__name__ for k in KINDS.values()}
    found = []
    for top in INSTALLED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "lab" in path.relative_to(ROOT).parts or own_file(path, kinds):
                continue
            found += [
                f"{path.relative_to(ROOT)}:{hit}" for hit in kind_switches(path.read_text(), names, classes)
            ]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_kind_switch():
    source = 'if cfg.kind == "dflash":\n    pass\nif isinstance(d, (EagleDrafter, int)):\n    pass\n'
    assert len(kind_switches(source, {"dflash"}, {"EagleDrafter"})) == 2
    assert kind_switches('if engine == "vllm":\n    pass\n', {"dflash"}, {"EagleDrafter"}) == []


def test_every_source_file_the_docs_name_exists():
    """A path like ``heads/eagle/model.py`` in the docs or a docstring names a real file (the
    adding-a-kind guide's ``new`` placeholders aside), so a move cannot leave a stale pointer."""
    pattern = re.compile(r"\b((?:heads|data|train|decode|bench|conf)/[A-Za-z_/]+\.py)\b")
    texts = [*ROOT.glob("docs/*.md"), ROOT / "README.md"]
    texts += [p for top in INSTALLED for p in (ROOT / top).rglob("*.py")]
    missing = sorted(
        {
            f"{t.relative_to(ROOT)}: {m}"
            for t in texts
            for m in pattern.findall(t.read_text())
            if "/new" not in m and not (ROOT / m).exists()
        }
    )
    assert not missing, "\n".join(missing)
