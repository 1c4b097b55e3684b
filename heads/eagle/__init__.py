"""EAGLE-1 and EAGLE-3 drafters: the model, its converter from published layouts, the engines' rules
and export, its heads facts."""

from draftheads.heads.eagle.kind import EagleKind
from draftheads.heads.eagle.model import EagleDrafter, check_norm_flags

__all__ = ["EagleDrafter", "EagleKind", "check_norm_flags"]
