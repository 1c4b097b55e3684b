"""The rows a run trains on: where they come from, which columns are kept, and the checks they
must pass for the drafter before anything is written.

Rows come from an offline feature cache (memory-mapped on disk: a row's features are read when
its micro-batch is built), from rows given to :func:`draftheads.train.recipe.train`, from a
saved dataset (``train.rows``), or from the data pipeline (``data.*``). Each source gives the
training rows and the rows the data checks and the draft vocabulary read: a cache's token
columns only (``input_ids``, ``loss_mask``; no features read), or the same in-memory rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.heads.target.fingerprint import TargetFingerprint
from draftheads.train.batching import check_rows
from draftheads.train.vocab import token_occurrences

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# the columns a row keeps from a dataset or from given rows
KEPT = ("input_ids", "loss_mask", "position_ids", "features")


def cached_rows(
    cfg: Config, fp: TargetFingerprint, layers: list[int], reads_topk: Callable[..., bool]
) -> tuple[Any, Any]:
    """(training rows, their token columns) of the feature cache ``train.feature_cache``, which
    must hold ``layers`` of the target ``fp`` (a cache of more layers, one built for several
    drafters, serves the ones read here), with the top-k logits where they are soft labels
    (``reads_topk(cache, train, draft)``: the kind's objective says, see ``Objective.reads_topk``)."""
    from draftheads.data.cache.read import FeatureCache

    t = cfg.train
    cache = FeatureCache(t.feature_cache, fp, layers, subset=True)
    soft = reads_topk(cache, t, cfg.draft)
    names = ["input_ids", "loss_mask", "features"]
    names += ["topk_ids", "topk_logits"] if soft else []
    tokens = cache.view(["input_ids", "loss_mask"])
    check_rows(tokens)
    return cache.view(names), tokens


def saved_rows(path: str) -> Iterable[dict]:
    """The rows of ``train.rows``, a ``datasets.save_to_disk`` folder."""
    import datasets

    return datasets.load_from_disk(path)


def pipeline_rows(cfg: Config, fp: TargetFingerprint, tokenizer: PreTrainedTokenizerBase) -> Iterable[dict]:
    """The training split of the data pipeline (``data.*``), once regenerated answers are checked
    to come from the target ``fp``."""
    from draftheads.data.prepare import prepare_dataset
    from draftheads.data.regenerated import check_regenerated_by

    check_regenerated_by(cfg.data, fp)
    source, _ = prepare_dataset(cfg.data, tokenizer, split="train")
    return source


def token_rows(source: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """(training rows, their token columns) of in-memory rows: the same list, of :data:`KEPT`."""
    rows = [{k: r[k] for k in KEPT if k in r} for r in source]
    check_rows(rows)
    return rows, rows


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
