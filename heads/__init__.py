"""Drafter modules and their checkpoint format; one folder per drafter kind (see :mod:`draftheads.heads.kinds`).

The kinds are the records of :data:`draftheads.conf.schema.kinds.BUILTIN_KINDS`; importing a
folder registers nothing. A kind's public names (``EagleDrafter``, ``MedusaHeads``) are answered
from its folder when first asked for (:func:`__getattr__`), so this package names no kind.
"""

from typing import Any

from draftheads.conf.moved import install
from draftheads.conf.schema.kinds import kind_export
from draftheads.heads.base import Drafter
from draftheads.heads.kinds import DrafterKind, drafter_kind
from draftheads.heads.target.fingerprint import TargetFingerprint, fingerprint
from draftheads.heads.target.load import load_target

install()

__all__ = ["Drafter", "DrafterKind", "TargetFingerprint", "drafter_kind", "fingerprint", "load_target"]


def __getattr__(name: str) -> Any:
    """A kind's public name, from the kind's folder (``from draftheads.heads import EagleDrafter``)."""
    return kind_export(__name__, name)
