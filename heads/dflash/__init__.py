"""DFlash block drafters: the model, its anchor prior, its converter from published layouts, the
engines' rules and export, its heads facts."""

from draftheads.heads.dflash.kind import DFlashKind
from draftheads.heads.dflash.model import DFlashDrafter, choose_mask_token, layer_shape

__all__ = ["DFlashDrafter", "DFlashKind", "choose_mask_token", "layer_shape"]
