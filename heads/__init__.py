"""Drafter modules and their checkpoint format; one folder per drafter kind (see :mod:`draftheads.heads.kinds`).

Importing this package registers every kind: ``medusa``, ``eagle`` (EAGLE-1 and EAGLE-3), ``dflash`` and ``peagle``.
"""

from draftheads.conf.moved import install
from draftheads.heads.base import Drafter
from draftheads.heads.dflash import DFlashDrafter
from draftheads.heads.eagle import EagleDrafter
from draftheads.heads.kinds import DrafterKind, drafter_kind, register_kind
from draftheads.heads.medusa import MedusaHeads, ResBlock
from draftheads.heads.peagle import PEagleDrafter
from draftheads.heads.target.fingerprint import TargetFingerprint, fingerprint
from draftheads.heads.target.load import load_target

install()

__all__ = [
    "DFlashDrafter",
    "Drafter",
    "DrafterKind",
    "EagleDrafter",
    "MedusaHeads",
    "PEagleDrafter",
    "ResBlock",
    "TargetFingerprint",
    "drafter_kind",
    "fingerprint",
    "load_target",
    "register_kind",
]
