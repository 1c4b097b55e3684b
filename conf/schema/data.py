"""Typed config of the data pipeline (Hydra group ``data/``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DistillConfig:
    """``draftheads distill``: regenerate assistant turns (or whole chats) with the target.

    ``source=data`` answers the prompts of ``data.path``; ``source=self`` lets the target write
    ``self_prompts`` user questions first (sampled with the ``prompt_*`` settings), then answers.
    ``temperature=0`` is greedy. Shards land in ``out_dir``; rerunning the command resumes.
    """

    out_dir: str = "outputs/distill"
    source: str = "data"
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 16
    seed: int = 0
    shard_rows: int = 1000
    self_prompts: int = 256
    prompt_max_new_tokens: int = 96
    prompt_temperature: float = 1.0
    prompt_top_p: float = 0.95
    # a trained drafter (directory or hub id): generate with the speculative decoder, whose
    # output is the target's own (identical under greedy, same distribution when sampling)
    heads: str | None = None


@dataclass
class FeaturesConfig:
    """``draftheads features``: the offline feature cache (see ``data/cache.py``).

    ``layers`` defaults to what ``draft`` reads (the last hidden state, or EAGLE-3's three).
    ``topk>0`` also stores the target's top-k logits; ``target_next`` its argmax next token.
    """

    out_dir: str = "outputs/features"
    layers: list[int] | None = None
    dtype: str = "bfloat16"
    batch_tokens: int = 4096
    target_next: bool = False
    topk: int = 0
    shard_mb: float = 512.0


@dataclass
class DataConfig:
    """Where training text comes from and how it becomes loss-masked token rows.

    ``path`` is ``embedded`` (HumanEval + standard-library docstrings, no download; also
    ``embedded:humaneval``, ``embedded:pydoc``, ``embedded:stdlib``), a Hugging Face dataset id,
    or local json/jsonl/parquet/arrow files. ``format`` is ``auto`` or one of ``sharegpt``,
    ``messages``, ``alpaca``, ``prompt``, ``text``. ``fields`` remaps canonical field names to the
    dataset's (e.g. ``{instruction: question, output: answer}``). ``mixture`` is a list of
    ``{path, weight, name?, format?, fields?, split?, max_rows?}``; when set it replaces ``path``.
    ``heldout_fraction`` holds back a hash-chosen share of a user dataset (the embedded set has a
    fixed 10% held-out split). Target-argmax labels for teacher-forced text come from the feature
    cache (``features.target_next=true``).
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
    heldout_fraction: float = 0.0
    min_loss_tokens: int = 2
    system_prompt: str | None = None
    seed: int = 0
    distill: DistillConfig = field(default_factory=DistillConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
