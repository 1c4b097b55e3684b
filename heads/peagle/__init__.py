"""P-EAGLE (parallel EAGLE): EAGLE-3's drafter drafting a step's k tokens in one pass.

``model``: :class:`PEagleDrafter` and its group pass; ``group``: the group's attention;
``sampling``: conditional-drop sampling of the training groups; ``draft``: one decoding pass
(:func:`parallel_draft`); ``convert``: speculators' ``peagle`` layout, both ways; ``kind``: its
heads facts (:class:`PEagleKind`).
"""

from draftheads.heads.peagle.draft import parallel_draft
from draftheads.heads.peagle.kind import PEagleKind
from draftheads.heads.peagle.model import PEagleDrafter
from draftheads.heads.peagle.sampling import DropSampling, conditional_drop, every_depth, group_entries

__all__ = [
    "DropSampling",
    "PEagleKind",
    "PEagleDrafter",
    "conditional_drop",
    "every_depth",
    "group_entries",
    "parallel_draft",
]
