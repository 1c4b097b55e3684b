"""Typed config of the data pipeline (Hydra group ``data/``)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from draftheads.conf.errors import UserError
from draftheads.conf.schema.checks import (
    BACKENDS,
    at_least,
    fraction,
    is_hub_id,
    one_of,
    positive,
    probability,
)

FORMATS = ("sharegpt", "messages", "alpaca", "prompt", "text")
# canonical field names ``data.fields`` can map to a dataset's own column names
FIELDS = (
    "conversations", "from", "value", "messages", "role", "content", "instruction", "input", "output",
    "prompt", "turns", "text", "system", "category", "id",
)  # fmt: skip
MIXTURE_KEYS = (
    "name", "path", "weight", "format", "fields", "split", "max_rows", "heldout_fraction", "optional",
    "in_data_dir",
)  # fmt: skip
DISTILL_SOURCES = ("data", "self")
STORE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class DistillConfig:
    """``draftheads distill``: regenerate assistant turns (or whole chats) with the target.

    ``source=data`` answers the prompts of ``data.path``; ``source=self`` lets the target write
    ``self_prompts`` user questions first (sampled with the ``prompt_*`` settings), then answers.
    ``temperature=0`` is greedy. Shards land in ``out_dir``; rerunning the command resumes.
    ``endpoint`` (``http://HOST:PORT/v1``) has an OpenAI-compatible server (vLLM, SGLang, TGI,
    ``transformers serve``) answer instead of the in-process target: ``model`` is its served
    model name (default: the one it serves), at most ``concurrency`` requests in flight, each
    given ``timeout_s`` seconds and ``retries`` more tries before the run stops.
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
    # the decoding backend of the target's batched generation (``decode.backend`` names; ``auto``
    # packs float32 weights for oneDNN on a CPU): same tokens under greedy, faster
    backend: str = "auto"
    endpoint: str | None = None
    model: str | None = None
    concurrency: int = 8
    timeout_s: float = 600.0
    retries: int = 3

    def __post_init__(self) -> None:
        """Refuse sizes that cannot generate, before the manifest of ``out_dir`` is written."""
        one_of("data.distill.source", self.source, DISTILL_SOURCES)
        one_of("data.distill.backend", self.backend, BACKENDS)
        for key, example in (
            ("max_new_tokens", 256),
            ("batch_size", 16),
            ("shard_rows", 1000),
            ("self_prompts", 256),
            ("prompt_max_new_tokens", 96),
        ):
            at_least(f"data.distill.{key}", getattr(self, key), 1, example)
        at_least("data.distill.temperature", self.temperature, 0, "0 (greedy)")
        at_least("data.distill.prompt_temperature", self.prompt_temperature, 0, 1.0)
        probability("data.distill.top_p", self.top_p, 1.0)
        probability("data.distill.prompt_top_p", self.prompt_top_p, 0.95)
        self.check_endpoint()
        self.check_heads()

    def check_heads(self) -> None:
        """``heads`` is an existing folder or a hub id ``ORG/NAME``: a missing path is refused
        before the target loads or the manifest of ``out_dir`` is written."""
        if not self.heads or Path(self.heads).expanduser().exists():
            return
        if str(self.heads).startswith((".", "/", "~")) or not is_hub_id(str(self.heads)):
            raise UserError(
                f"data.distill.heads={self.heads}: no such folder, and not a hub id; give a drafter "
                "checkpoint folder or ORG/NAME, or drop data.distill.heads to generate with the target alone"
            )

    def check_endpoint(self) -> None:
        """An ``endpoint`` is an http(s) URL with a host; its settings are in range and only
        given with it; a drafter (``heads``) cannot decode on someone else's server."""
        at_least("data.distill.concurrency", self.concurrency, 1, 8)
        positive("data.distill.timeout_s", self.timeout_s, 600)
        at_least("data.distill.retries", self.retries, 0, 3)
        if self.endpoint is None:
            if self.model is not None:
                raise UserError(
                    f"data.distill.model={self.model} names a served model but data.distill.endpoint is "
                    "not set; add data.distill.endpoint=http://HOST:PORT/v1 or drop data.distill.model"
                )
            return
        if self.model is not None and not str(self.model).strip():
            raise UserError("data.distill.model is empty; give the served model name or drop the key")
        if not valid_url(str(self.endpoint).strip()):
            raise UserError(
                f"data.distill.endpoint={self.endpoint!r} is not a server URL; "
                "use http://HOST:PORT/v1 (an OpenAI-compatible server), or drop the key to distill in-process"
            )
        if self.heads:
            raise UserError(
                f"data.distill.heads={self.heads} and data.distill.endpoint={self.endpoint} are both set; "
                "the server decodes on its own: drop data.distill.heads (or the endpoint)"
            )


def valid_url(url: str) -> bool:
    """An http(s) URL with a host and, when given, a numeric port."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@dataclass
class FeaturesConfig:
    """``draftheads features``: the offline feature cache (see ``data/cache/build.py``).

    ``layers`` defaults to what ``draft`` trains on (``DraftConfig.training_layers``: the last hidden
    state, or a drafter's input layers and, where it learns from it, the final state).
    ``topk>0`` also stores the target's top-k logits; ``target_next`` its argmax next token.
    """

    out_dir: str = "outputs/features"
    layers: list[int] | None = None
    dtype: str = "bfloat16"
    batch_tokens: int = 4096
    target_next: bool = False
    topk: int = 0
    shard_mb: float = 512.0

    def __post_init__(self) -> None:
        """Refuse cache settings that cannot store a row, before the target is loaded."""
        at_least("data.features.batch_tokens", self.batch_tokens, 1, 4096)
        at_least("data.features.topk", self.topk, 0, "0 (no top-k logits)")
        positive("data.features.shard_mb", self.shard_mb, 512)
        one_of("data.features.dtype", self.dtype, STORE_DTYPES)
        if self.layers is not None:
            if not self.layers:
                raise UserError("data.features.layers=[] names no layer; drop it to use the drafter's layers")
            for i in self.layers:
                at_least("data.features.layers[]", i, 0, "[1,2,3]")


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
    cache (``features.target_next=true``), the target's top-k distribution from ``features.topk``.
    A mixture component with ``optional: true`` whose path does not exist is left out with a
    message in the report. ``data_dir`` is the folder of the user's own copies of public data
    sets (GSM8K, CodeAlpaca): a component with ``in_data_dir: true`` names a path inside it.
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
    data_dir: str = "../shared/data"
    distill: DistillConfig = field(default_factory=DistillConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)

    def __post_init__(self) -> None:
        """Refuse values that would read nothing or train nothing, before any data is read."""
        fraction("data.heldout_fraction", self.heldout_fraction, 0.05)
        at_least("data.max_length", self.max_length, 2, 512)
        at_least("data.max_rows", self.max_rows, 1, 1000)
        at_least("data.show", self.show, 0, 2)
        at_least("data.min_loss_tokens", self.min_loss_tokens, 0, 2)
        check_format("data.format", self.format)
        check_fields("data.fields", self.fields)
        for i, comp in enumerate(self.mixture):
            check_component(i, comp)
        names = [str(c.get("name") or c.get("path")) for c in self.mixture]
        if len(set(names)) != len(names):
            raise UserError("data.mixture has two components with the same name; give each a distinct name")


def check_format(key: str, fmt: str) -> None:
    """``fmt`` is ``auto`` or a known row format."""
    one_of(key, fmt, ("auto", *FORMATS))


def check_fields(key: str, fields: dict) -> None:
    """Every key of a field map is a canonical field name and every value a column name."""
    for name, column in fields.items():
        if name not in FIELDS:
            near = difflib.get_close_matches(name, FIELDS, n=1)
            guess = f"did you mean {key}.{near[0]}? " if near else ""
            raise UserError(
                f"{key}.{name} is not a field name; {guess}map one of {', '.join(FIELDS)} "
                f"to your dataset's column (e.g. {key}.text=body)"
            )
        if not isinstance(column, str) or not column:
            raise UserError(f"{key}.{name}={column!r} is not a column name; give the dataset's column")


def check_component(i: int, comp: dict) -> None:
    """One ``data.mixture`` entry: known keys, a path, a positive weight, sane counts."""
    key = f"data.mixture[{i}]"
    if not isinstance(comp, dict):
        raise UserError(f"{key} is not a mapping; each component is {{path, weight, name?, ...}}")
    bad = sorted(set(comp) - set(MIXTURE_KEYS))
    if bad or "path" not in comp:
        raise UserError(
            f"{key} has {'unknown keys ' + str(bad) if bad else 'no path'}; "
            f"each component takes {', '.join(sorted(MIXTURE_KEYS))}"
        )
    try:
        weight = float(comp.get("weight", 1.0))
    except (TypeError, ValueError):
        raise UserError(f"{key}.weight={comp['weight']!r} is not a number; use a weight > 0") from None
    positive(f"{key}.weight", weight, 1)
    if comp.get("format") is not None:
        check_format(f"{key}.format", comp["format"])
    check_fields(f"{key}.fields", dict(comp.get("fields") or {}))
    at_least(f"{key}.max_rows", comp.get("max_rows"), 1, 1000)
    fraction(f"{key}.heldout_fraction", float(comp.get("heldout_fraction", 0.0)), 0.05)
