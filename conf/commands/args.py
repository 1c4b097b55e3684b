"""Each command's typed arguments: the config groups and keys it reads, and nothing else.

A command's argument dataclass names the parts of :class:`draftheads.conf.schema.Config` it
reads (same names, same types), plus, for the benchmark commands, an options group of its
own (``speed.*``) that the root config does not carry. The command line refuses an override
of anything else with one line naming the right key, and ``draftheads <command> --help``
lists exactly these keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from draftheads.conf.schema import BenchConfig, Config
from draftheads.conf.schema.checks import at_least
from draftheads.conf.schema.data import DataConfig
from draftheads.conf.schema.decode import DecodeConfig, EvalConfig
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from draftheads.conf.schema.train import LoggerConfig, TrainConfig


@dataclass
class DataArgs:
    """``draftheads data``: prepare a training set and optionally save it to ``out_dir``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    out: str | None = None


@dataclass
class DistillArgs:
    """``draftheads distill``: answer ``data`` prompts with the target into ``data.distill.out_dir``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    revision: str | None = None


@dataclass
class FeaturesArgs:
    """``draftheads features``: cache what ``draft`` trains on, for the ``data`` rows."""

    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class TrainArgs:
    """``draftheads train``: train ``draft`` on ``data`` against the frozen ``target``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: dict = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


@dataclass
class TreeArgs:
    """``draftheads tree``: measure Medusa heads on held-out prompts, save the best tree."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    heads: str | None = None
    revision: str | None = None
    out: str | None = None


@dataclass
class GenerateArgs:
    """``draftheads generate``: stream one speculative answer to ``prompt``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    heads: str | None = None
    revision: str | None = None
    prompt: str | None = None


@dataclass
class EvalArgs:
    """``draftheads eval``: τ and speedup on ``eval.prompts``, report under ``eval.out_dir``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    heads: str | None = None
    revision: str | None = None


@dataclass
class PushArgs:
    """``draftheads push``: upload ``heads`` (and its eval report) to ``repo_id``."""

    heads: str | None = None
    repo_id: str | None = None
    private: bool = False
    revision: str | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)


@dataclass
class ExportArgs:
    """``draftheads export``: write ``heads`` in an engine's ``format`` to ``out_dir``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    heads: str | None = None
    revision: str | None = None
    format: str | None = None
    out: str | None = None


@dataclass
class InfoArgs:
    """``draftheads info``: what a checkpoint holds."""

    heads: str | None = None
    revision: str | None = None


@dataclass
class BenchArgs:
    """``draftheads bench`` / ``demo``: the end-to-end pipeline (``bench.*`` sizes every stage)."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    prompt: str | None = None


@dataclass
class DecodeSpeedOptions:
    """``speed.*`` of ``draftheads speed``: batch sizes, prompt count, EAGLE-2 settings to compare."""

    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 8])
    prompts: int = 8
    # EAGLE-2 tree settings [top_k_draft, depth, total_tokens], one table each; empty: decode.* as set
    dynamic: list[list[int]] = field(default_factory=list)
    # also print the verify-cost curve (1..64 new tokens) of eager and of decode.backend
    curve: bool = False


@dataclass
class SpeedArgs:
    """``draftheads speed``: tokens/s of speculative against plain greedy decoding, per batch size."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=lambda: DecodeConfig(max_new_tokens=64))
    heads: str | None = None
    revision: str | None = None
    speed: DecodeSpeedOptions = field(default_factory=DecodeSpeedOptions)


@dataclass
class TrainSpeedOptions:
    """``speed.*`` of ``draftheads train-speed``: the feature cache and how much of it to train on."""

    cache: str = "outputs/bench/teacher"
    tokens: int = 8000
    steps: int = 8
    # train.pack_micro_batches of the run (false: every micro-batch padded to its longest row)
    pack: bool = True


@dataclass
class TrainSpeedArgs:
    """``draftheads train-speed``: training tokens/s of the bench recipe on a feature cache."""

    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    speed: TrainSpeedOptions = field(default_factory=TrainSpeedOptions)


@dataclass
class DataSpeedOptions:
    """``speed.*`` of ``draftheads data-speed``: how many tokens to extract features for, and how
    (``topk > 0``: EAGLE-3's training layers and the target's top-k logits, as the bench's
    teacher-forced cache; else the last layer alone); with ``distill_prompts > 0``, greedy
    distillation of that many training prompts (batches of ``distill_batch_size``,
    ``distill_new_tokens`` new tokens) by the decoder's batched loop and by transformers'
    ``generate``, both on ``data.distill.backend``."""

    feature_tokens: int = 20000
    batch_tokens: int = 4096
    dtype: str = "bfloat16"
    topk: int = 0
    distill_prompts: int = 0
    distill_batch_size: int = 32
    distill_new_tokens: int = 128

    def __post_init__(self) -> None:
        """Refuse a negative top-k before the target loads (it would fail inside ``topk``)."""
        at_least("speed.topk", self.topk, 0, 64)


@dataclass
class DataSpeedArgs:
    """``draftheads data-speed``: tokens/s of tokenising + masking and of feature extraction."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(max_length=512))
    speed: DataSpeedOptions = field(default_factory=DataSpeedOptions)


ROOT_FIELDS = frozenset(f.name for f in fields(Config))


def own_keys(args_type: type) -> frozenset[str]:
    """The top-level keys of ``args_type`` that the root config does not carry (its options)."""
    return frozenset(f.name for f in fields(args_type)) - ROOT_FIELDS


def from_config(args_type: type, cfg: Config, options: dict[str, object] | None = None):
    """The command's arguments, taken from the composed root config (and its own options)."""
    values = {f.name: getattr(cfg, f.name) for f in fields(args_type) if f.name in ROOT_FIELDS}
    return args_type(**values, **(options or {}))


def to_config(args) -> Config:
    """A root :class:`Config` holding ``args`` (defaults elsewhere), for code that takes one."""
    return Config(**{f.name: getattr(args, f.name) for f in fields(args) if f.name in ROOT_FIELDS})
