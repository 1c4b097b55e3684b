"""Medusa heads: the model, its converter from published layouts, vLLM's rules and export, its heads facts."""

from draftheads.heads.medusa.kind import MedusaKind
from draftheads.heads.medusa.model import MedusaHeads, ResBlock

__all__ = ["MedusaHeads", "MedusaKind", "ResBlock"]
