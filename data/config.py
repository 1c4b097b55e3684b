"""Typed config of the data pipeline (Hydra group ``data/``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataConfig:
    """Where training text comes from and how it becomes loss-masked token rows.

    ``path`` is ``embedded`` (HumanEval + standard-library docstrings, no download), a
    Hugging Face dataset id, or local json/jsonl/parquet/arrow files.
    """

    path: str = "embedded"
    format: str = "auto"
    split: str = "train"
    max_length: int = 512
    max_rows: int | None = None
    packing: bool = False
    strict: bool = False
    show: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    mixture: list[dict] = field(default_factory=list)
    cache_dir: str | None = None
