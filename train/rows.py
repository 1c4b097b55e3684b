"""The rows a run trains on: where they come from, which columns are kept, and the checks they
must pass for the drafter before anything is written.

Rows come from an offline feature cache (memory-mapped on disk: a row's features are read when
its micro-batch is built), from rows given to :func:`draftheads.train.recipe.train`, from a
saved dataset (``train.rows``), or from the data pipeline (``data.*``). Each source gives the
training rows and the rows the data checks and the draft vocabulary read: a cache's token
columns only (``input_ids``, ``loss_mask``; no features read), or the same in-memory rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from draftheads.conf.schema import Config
from draftheads.heads.target.fingerprint import TargetFingerprint
from draftheads.train.batching import check_rows

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
