"""A reduced draft vocabulary: the ``d2t``/``t2d`` convention of Li et al. (2025), SpecForge and vLLM.

A drafter that predicts over ``Vd`` of the target's ``V`` token ids keeps two buffers::

    target id = draft id + d2t[draft id]          # d2t: [Vd] int64
    t2d[target id] = (target id is a draft id)     # t2d: [V] bool

The draft ids are the target ids sorted, so ``d2t`` is non-decreasing and ``0`` everywhere for
the full vocabulary (then the map is the identity). The head over the reduced vocabulary is the
target's lm_head rows of those ids: a drafter either starts its own trained head there or computes
with them frozen (its kind's model says which). Such drafters mix :class:`ReducedVocab` in, so
the buffers keep their names (``d2t``, ``t2d``) at the top of the state dict, as every engine and
reference checkpoint has them.
"""

from __future__ import annotations

import torch
from torch import nn

from draftheads.conf.errors import UserError


def check_draft_vocab_size(draft_vocab_size: int, vocab_size: int, kind: str) -> int:
    """``draft_vocab_size`` (``draft.<kind>.draft_vocab_size``) as an int, refused unless it lies in ``1..vocab_size``."""
    size = int(draft_vocab_size)
    if not 1 <= size <= vocab_size:
        raise UserError(
            f"draft.{kind}.draft_vocab_size={size} must be between 1 and the target vocab {vocab_size}"
        )
    return size


def t2d_from_d2t(d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    """The target-vocab membership mask of the draft ids ``i + d2t[i]`` (out-of-range ids clamped;
    :func:`check_vocab_maps` refuses them)."""
    ids = torch.arange(d2t.numel()) + d2t.long()
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids.clamp(0, vocab - 1)] = True
    return t2d


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, vocab: int, where: str) -> None:
    """The maps must agree: draft id i is target id i + d2t[i], distinct, in range, marked in t2d."""
    ids = torch.arange(d2t.numel()) + d2t.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != ids.numel()):
        raise UserError(f"{where}: d2t maps draft ids outside the target vocabulary or twice; it is corrupt")
    if t2d.numel() != vocab or int(t2d.bool().sum()) != ids.numel() or not bool(t2d.bool()[ids].all()):
        raise UserError(f"{where}: t2d disagrees with d2t; the vocabulary maps are corrupt")


def frozen_rows(weight: torch.Tensor, ids: torch.Tensor) -> nn.Linear:
    """A frozen ``nn.Linear`` whose rows are ``weight[ids]``: the target's head over the draft ids.

    Built as a normal tensor even under inference mode (a backend reads its version to know when
    to repack it), and without random initialisation, which would draw from the global RNG only
    to be overwritten (training draws its anchors there)."""
    with torch.inference_mode(False), torch.no_grad():
        head = nn.utils.skip_init(
            nn.Linear, weight.shape[1], ids.numel(), bias=False, device=weight.device, dtype=weight.dtype
        )
        head.weight.copy_(weight.detach()[ids.to(weight.device)])
    head.requires_grad_(False)
    return head


class ReducedVocab:
    """Mixin for a drafter ``nn.Module`` with ``draft_vocab_size`` and a target fingerprint."""

    draft_vocab_size: int

    def init_reduced_vocab(self, vocab_size: int) -> None:
        """Register ``d2t`` [Vd] and ``t2d`` [V] and install the first ``Vd`` ids."""
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(vocab_size, dtype=torch.bool))
        self.set_vocab(torch.arange(self.draft_vocab_size))

    @property
    def reduced_vocab(self) -> bool:
        """True when the draft vocabulary is smaller than the target's."""
        return self.draft_vocab_size < self.target_fingerprint.vocab_size

    @torch.no_grad()
    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """Install a draft vocabulary: ``draft_vocab_size`` target ids, in any order."""
        device = self.d2t.device
        draft_ids = torch.as_tensor(draft_ids, dtype=torch.long, device=device).flatten().sort().values
        if draft_ids.numel() != self.draft_vocab_size:
            raise UserError(f"draft vocabulary has {draft_ids.numel()} ids, expected {self.draft_vocab_size}")
        self.d2t.copy_(draft_ids - torch.arange(self.draft_vocab_size, device=device))
        self.t2d.zero_()
        self.t2d[draft_ids] = True
        self.vocab_changed()

    def vocab_changed(self) -> None:
        """Hook: drop whatever was built from the previous vocabulary."""

    def target_ids(self) -> torch.Tensor:
        """The target id of every draft id, ``[Vd]``."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    @property
    def maps_ids(self) -> bool:
        """Whether the head's row i is target id ``i + d2t[i]``: so for a reduced vocabulary (a
        drafter that computes with the target's own full head needs no map)."""
        return self.reduced_vocab

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids."""
        return ids + self.d2t[ids] if self.maps_ids else ids
