"""Drafter modules and their checkpoint format."""

from draftheads.heads.base import Drafter
from draftheads.heads.dflash import DFlashDrafter
from draftheads.heads.eagle import EagleDrafter
from draftheads.heads.medusa import MedusaHeads, ResBlock
from draftheads.heads.target import load_target
from draftheads.heads.target_fingerprint import TargetFingerprint, fingerprint

__all__ = [
    "DFlashDrafter",
    "Drafter",
    "EagleDrafter",
    "MedusaHeads",
    "ResBlock",
    "TargetFingerprint",
    "fingerprint",
    "load_target",
]
