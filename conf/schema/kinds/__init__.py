"""Per-kind draft-config facts (:mod:`~draftheads.conf.schema.kinds.registry`); importing this
package registers every kind's module, in the order messages list the kinds."""

# isort: skip_file
from draftheads.conf.schema.kinds.registry import (
    DRAFT_KINDS,
    DraftKind,
    depth_problem,
    draft_kind,
    register_draft_kind,
    unknown_kind_problem,
)
from draftheads.conf.schema.kinds.medusa import MedusaDraft
from draftheads.conf.schema.kinds.eagle import EagleDraft
from draftheads.conf.schema.kinds.dflash import DFlashDraft
from draftheads.conf.schema.kinds.peagle import PEagleDraft

__all__ = [
    "DRAFT_KINDS",
    "DFlashDraft",
    "DraftKind",
    "depth_problem",
    "EagleDraft",
    "MedusaDraft",
    "PEagleDraft",
    "draft_kind",
    "register_draft_kind",
    "unknown_kind_problem",
]
