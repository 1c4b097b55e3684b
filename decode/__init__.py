"""draftheads.decode: the tree-attention speculative decoder (Medusa, EAGLE and DFlash drafters;
one proposer per kind, named by its record, see :mod:`draftheads.decode.proposers`)."""

from draftheads.decode.generator import DecodeStats, SpeculativeGenerator

__all__ = ["DecodeStats", "SpeculativeGenerator"]
