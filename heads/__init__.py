"""Drafter modules and their checkpoint format; one folder per drafter kind (see :mod:`draftheads.heads.kinds`).

The kinds are the records of :data:`draftheads.conf.schema.kinds.BUILTIN_KINDS`; importing a
folder registers nothing.
"""

from draftheads.conf.moved import install
from draftheads.heads.base import Drafter
from draftheads.heads.dflash import DFlashDrafter
from draftheads.heads.eagle import EagleDrafter
from draftheads.heads.kinds import DrafterKind, drafter_kind
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
]
