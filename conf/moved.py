"""Old import paths of modules that moved into packages keep working, with a warning that names the new one.

Families of modules that shared a prefix became packages (``heads/target/``, ``heads/convert/``,
``heads/engine/``, ``data/cache/``, ``data/distill/``, ``train/dry_run/``). Code that still
imports an old path, say ``draftheads.data.cache_build``, gets the moved module itself (the same
object, so patching it patches the code that runs) and one ``DeprecationWarning``. A package that
took an old module's name (``draftheads.data.cache``) answers that module's names through
:func:`forward`. ``heads``, ``data`` and ``train`` call :func:`install` when they are imported,
so the finder is in place before any old name under them is looked up. This module imports
nothing of draftheads, so every layer may use it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

# old module path -> where it lives now
MOVED: dict[str, str] = {
    "draftheads.heads.target_fingerprint": "draftheads.heads.target.fingerprint",
    "draftheads.heads.embedded_target": "draftheads.heads.target.embedded",
    "draftheads.heads.target_layers": "draftheads.heads.target.layers",
    "draftheads.heads.placement": "draftheads.heads.target.placement",
    "draftheads.heads.convert_target_copies": "draftheads.heads.convert.target_copies",
    "draftheads.heads.engine_spec": "draftheads.heads.engine.spec",
    "draftheads.heads.engines": "draftheads.heads.engine.loaders",
    "draftheads.data.cache_build": "draftheads.data.cache.build",
    "draftheads.data.cache_encode": "draftheads.data.cache.encode",
    "draftheads.data.cache_manifest": "draftheads.data.cache.manifest",
    "draftheads.data.cache_views": "draftheads.data.cache.views",
    "draftheads.data.distill_answers": "draftheads.data.distill.answers",
    "draftheads.data.distill_generate": "draftheads.data.distill.generate",
    "draftheads.data.distill_roundtrip": "draftheads.data.distill.roundtrip",
    "draftheads.data.distill_shards": "draftheads.data.distill.shards",
    "draftheads.train.sizing": "draftheads.train.dry_run.sizing",
    "draftheads.train.tiny_run": "draftheads.train.dry_run.tiny_run",
}


def moved_warning(old: str, new: str) -> None:
    """One warning per old path, naming its replacement."""
    warnings.warn(f"{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the moved module (the loader hands back the existing object)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        moved_warning(spec.name, MOVED[spec.name])
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the moved module ran when it was imported under its own name."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())


def forward(package: str, module: str) -> Callable[[str], Any]:
    """A package ``__getattr__`` that answers the names of the old module the package replaced.

    ``from draftheads.data.cache import FeatureCache`` still works now that the module of that name
    is the package's ``read``; the module is imported on first use, so the package stays light.
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = importlib.import_module(module)
        if not hasattr(target, name):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(target, name)

    return __getattr__
