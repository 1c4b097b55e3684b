"""draftheads.decode: the tree-attention speculative decoder (a drafter of any kind, through the
one proposer its kind's record names, see :mod:`draftheads.decode.proposers`)."""

from draftheads.decode.generator import DecodeStats, SpeculativeGenerator

__all__ = ["DecodeStats", "SpeculativeGenerator"]
