"""DFlash's checks of its settings against the training rows and the tokenizer, before anything
is trained: a mask token the data or text produces, a block or anchor count no answer holds, top-k labels a feature cache lacks.
P-EAGLE, which masks its deeper positions with a mask token too, uses the mask checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.train.vocab import token_occurrences


def check_mask_token(mask_id: int, rows: Sequence[dict], kind: str) -> None:
    """Refuse a mask token (``draft.<kind>.mask_token_id``: DFlash's, P-EAGLE's) that occurs in the
    training rows: the drafter could not tell a masked position from that token."""
    count, first = token_occurrences(rows, mask_id)
    if count:
        raise UserError(
            f"draft.{kind}.mask_token_id={mask_id} occurs {count} time(s) in the training rows (first in row {first}); "
            f"set draft.{kind}.mask_token_id to a token id that never occurs in the data (e.g. an unused special token)"
        )


def check_block_size(block: int, rows: Sequence[dict]) -> None:
    """Refuse a DFlash ``draft.dflash.block_size`` longer than every row's answer: no block would fit in
    an answer, and training it costs minutes for positions no answer reaches."""
    most = max((int(sum(r["loss_mask"])) for r in rows), default=0)
    if block > most:
        raise UserError(
            f"draft.dflash.block_size={block} is longer than the longest answer in the training rows ({most} tokens); "
            f"use at most {most} (the engines take any block of at least 2 and verify block_size - 1 drafted "
            "tokens a step: vLLM num_speculative_tokens = block_size - 1, SGLang --speculative-num-draft-tokens "
            "= block_size; z-lab's drafters use 16)"
        )


def check_mask_choice(mask_id: int, tokenizer, kind: str) -> None:
    """Refuse a given ``draft.<kind>.mask_token_id`` (DFlash's, P-EAGLE's) that is an ordinary text token: the mask must
    be a token text never produces, one of the tokenizer's special tokens (or an id past the
    tokenizer's vocabulary, which no text maps to)."""
    from draftheads.heads.dflash import choose_mask_token
    from draftheads.heads.dflash.model import ordinary_token

    text = ordinary_token(mask_id, tokenizer)
    if text is None:
        return
    try:
        fix = f"e.g. draft.{kind}.mask_token_id={choose_mask_token(tokenizer)}, or null to choose one"
    except UserError:
        fix = "or an id past the tokenizer's vocabulary"
    raise UserError(
        f"draft.{kind}.mask_token_id={mask_id} is the ordinary text token {text!r}, "
        f"which text produces; use one of the tokenizer's special tokens ({fix})"
    )


def check_anchor_count(anchors: int, rows: Sequence[dict]) -> None:
    """Refuse ``draft.dflash.anchors_per_row`` above every row's answer tokens: no row could hold that
    many blocks, so the count is a mistake (0 asks for a block at every answer position)."""
    most = max((int(sum(r["loss_mask"])) for r in rows), default=0)
    if anchors > most:
        raise UserError(
            f"draft.dflash.anchors_per_row={anchors} is above the most answer tokens of any training row ({most}); "
            f"use at most {most}, or 0 for a block at every answer position"
        )


def cached_topk(cache: Any, t: Any) -> bool:
    """Whether DFlash (and P-EAGLE) learns from the feature cache's top-k logits (``train.soft_labels`` auto or topk;
    ``full`` is refused when the config is read), refusing ``topk`` from a cache without them."""
    stored = int(cache.manifest.get("topk", 0))
    if t.soft_labels == "topk" and not stored:
        raise UserError(
            f"train.soft_labels=topk but feature cache {cache.dir} stores no top-k logits; rebuild "
            "it with data.features.topk=64, or use train.soft_labels=auto (the data's next tokens)"
        )
    return bool(stored)
