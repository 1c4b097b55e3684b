"""Checks and adjustments that come before any training work: where the run writes, what it
would overwrite, which soft labels a feature cache allows, and dtypes where target meets drafter.

Each refusal is one line (:class:`UserError`) naming the problem and the fix, raised before the
target is loaded or anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DraftConfig
from draftheads.conf.schema.kinds import draft_kind
from draftheads.conf.schema.train import TrainConfig
from draftheads.data.outdir import claim_out_dir, guard_out_dir, writable_dir
from draftheads.train.checkpoint import config_mismatch

if TYPE_CHECKING:
    from draftheads.data.cache.read import FeatureCache


def is_rank_zero() -> bool:
    """Whether this is the launcher's rank 0 (or no launcher): the one process that claims the folder."""
    return int(os.environ.get("RANK", "0")) == 0


def check_output_dir(out: Path) -> None:
    """Claim ``train.out_dir`` for this run, before the target is loaded (rank 0; the others check
    that it can be written).

    Refused in one line: a file, an unwritable path, a folder inside another run's
    ``checkpoints/``, a non-empty folder that is not a draftheads training run, a ``README.md``
    there that is not a draftheads model card (the run writes its card there), and a folder
    another process is training into (its lock, released when the run's metrics close).
    """
    key = "train.out_dir"
    if not is_rank_zero():
        writable_dir(out, key)
        return
    guard_out_dir(out, "train", key)
    card = out / "README.md"
    if card.is_file() and not is_model_card(card):
        raise UserError(
            f"{key}={out} holds a README.md that is not a draftheads model card, and the run would replace "
            f"it with its card; move that file away or choose another folder (e.g. {key}={out / 'train'})"
        )
    claim_out_dir(out, "train", key)


def is_model_card(path: Path) -> bool:
    """Whether ``path`` is a model card draftheads wrote (its metadata names the library)."""
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return False
    return head.startswith("---") and "library_name: draftheads" in head


def check_finished_run(out: Path, current: dict[str, Any]) -> None:
    """Refuse to train over a finished drafter of another kind or config in ``out``."""
    meta = out / "config.json"
    if not meta.is_file():
        return
    try:
        saved = json.loads(meta.read_text())["provenance"]["config"]
    except (OSError, ValueError, KeyError, TypeError):
        saved = None
    diff = "it was not written by draftheads train" if saved is None else config_mismatch(saved, current)
    if diff is not None:
        raise UserError(
            f"train.out_dir={out} holds a finished drafter of another run ({diff}); "
            "pick another train.out_dir, or delete that one to replace it"
        )


def cast_shared_inputs(target: nn.Module) -> None:
    """Let the target's frozen lm_head, which drafters share, take inputs of any float dtype.

    A bfloat16 target under fp32 training would otherwise fail on its first step: the drafter's
    fp32 states meet the bf16 weight. The hook casts the input to the weight's dtype (a no-op
    when they agree); the losses are computed in fp32 anyway.
    """
    head = target.get_output_embeddings()
    if head is not None and not getattr(head, "_draftheads_casts", False):
        head.register_forward_pre_hook(lambda m, args: (args[0].to(m.weight.dtype), *args[1:]))
        head._draftheads_casts = True


def use_topk(cache: FeatureCache, train: TrainConfig, d: DraftConfig) -> bool:
    """Whether the drafter's token loss reads the cache's top-k logits (its kind's ``topk_labels``;
    see ``train.soft_labels``); refuses a combination that cannot work, before any training."""
    mode = train.soft_labels
    stored = int(cache.manifest.get("topk", 0))
    labels = draft_kind(d.kind).topk_labels(d)
    if mode == "topk" and not stored:
        raise UserError(
            f"train.soft_labels=topk but feature cache {cache.dir} stores no top-k logits; rebuild "
            "it with data.features.topk=64, or use train.soft_labels=full"
        )
    if stored and mode != "full" and labels == "full":
        raise UserError(
            f"feature cache {cache.dir} holds top-k logits, but this drafter (draft.kind={d.kind}) learns "
            "the full-vocabulary distribution, which top-k would cut; pass train.soft_labels=full "
            "(projected from the cached states)"
        )
    if mode == "topk" and labels != "learns":
        raise UserError(
            f"train.soft_labels=topk trains on cached top-k logits, which this drafter (draft.kind={d.kind}) "
            "does not learn from; use train.soft_labels=full"
        )
    return bool(stored) and labels == "learns" and mode != "full"
