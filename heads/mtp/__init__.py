"""MTP heads: one decoder layer started as the target's last, run recursively over its own
outputs, served in EAGLE-1's layout; the model and its heads facts."""

from draftheads.heads.mtp.kind import MTPKind
from draftheads.heads.mtp.model import MTPDrafter

__all__ = ["MTPDrafter", "MTPKind"]
