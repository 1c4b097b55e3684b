"""draftheads.decode: the tree-attention speculative decoder (Medusa and EAGLE drafters)."""

from draftheads.decode.generator import DecodeStats, SpeculativeGenerator

__all__ = ["DecodeStats", "SpeculativeGenerator"]
