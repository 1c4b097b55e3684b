"""Each command's typed arguments: the config groups and keys it reads, and nothing else.

A command's argument dataclass names the parts of :class:`draftheads.conf.schema.Config` it
reads (same names, same types), plus, for the benchmark commands, an options group of its
own (``speed.*``) that the root config does not carry. The command line refuses an override
of anything else with one line naming the right key, and ``draftheads <command> --help``
lists exactly these keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from draftheads.conf.commands.checks import cost_cache_writable, decode_fits, something_drafts
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig, Config
from draftheads.conf.schema.checks import at_least, backend_fits, one_of
from draftheads.conf.schema.data import STORE_DTYPES, DataConfig
from draftheads.conf.schema.decode import PROMPT_SETS, DecodeConfig, EvalConfig, check_temperatures
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from draftheads.conf.schema.recipe import RecipeConfig
from draftheads.conf.schema.train import LoggerConfig, TrainConfig, validate


@dataclass
class DataArgs:
    """``draftheads data``: prepare a training set and optionally save it to ``out_dir``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    out: str | None = None


@dataclass
class DistillArgs:
    """``draftheads distill``: answer ``data`` prompts with the target into ``data.distill.out_dir``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    revision: str | None = None

    def __post_init__(self) -> None:
        """Refuse a distillation backend the target cannot run on, naming ``data.distill.backend``."""
        distill_backend_fits(self.target, self.data)


@dataclass
class FeaturesArgs:
    """``draftheads features``: cache what ``draft`` trains on, for the ``data`` rows."""

    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)


@dataclass
class TrainArgs:
    """``draftheads train``: train ``draft`` on ``data`` against the frozen ``target``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: dict = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)

    def __post_init__(self) -> None:
        """Every value check of a training run, when the command line is read (the recipe repeats
        them for Python callers)."""
        validate(self)


@dataclass
class TreeArgs:
    """``draftheads tree``: measure heads that index a static tree by depth on held-out prompts, save the
    best tree."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    heads: str | None = None
    revision: str | None = None
    out: str | None = None

    def __post_init__(self) -> None:
        """Refuse decoding settings this command cannot use (:func:`decode_fits`)."""
        decode_fits("tree", self.decode)


@dataclass
class GenerateArgs:
    """``draftheads generate``: stream one speculative answer to ``prompt``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    heads: str | None = None
    revision: str | None = None
    prompt: str | None = None

    def __post_init__(self) -> None:
        """Refuse settings this command cannot use (:func:`decode_fits`, :func:`something_drafts`)."""
        decode_fits("generate", self.decode)
        something_drafts(self.heads, self.decode)


@dataclass
class EvalArgs:
    """``draftheads eval``: τ and speedup on ``eval.prompts``, report under ``eval.out_dir``."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    heads: str | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        """Refuse settings this command cannot use (:func:`decode_fits`, :func:`something_drafts`)."""
        decode_fits("eval", self.decode)
        something_drafts(self.heads, self.decode)


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
    # the local folder of the target the export is served with: recorded as a speculators
    # export's verifier, and the target of the printed serve command; checked to be the target
    verifier: str | None = None


@dataclass
class InfoArgs:
    """``draftheads info``: what a checkpoint holds (an engine's or z-lab's layout is imported
    onto ``target``: the drafter it becomes)."""

    target: TargetConfig = field(default_factory=TargetConfig)
    heads: str | None = None
    revision: str | None = None


@dataclass
class BenchArgs:
    """``draftheads bench``: the end-to-end pipeline (``bench.*`` sizes every stage)."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)

    def __post_init__(self) -> None:
        """Refuse a distillation backend the target cannot run on, naming ``data.distill.backend``."""
        distill_backend_fits(self.target, self.data)
        cost_cache_writable(self.decode)


@dataclass
class DemoArgs:
    """``draftheads demo``: the pipeline at the demo's fixed sizes into ``outputs/demo``, then one
    streamed answer to ``prompt``. It reads no ``bench.*`` key (``draftheads bench`` does)."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    prompt: str | None = None

    def __post_init__(self) -> None:
        """Refuse a distillation backend the target cannot run on, naming ``data.distill.backend``."""
        distill_backend_fits(self.target, self.data)
        cost_cache_writable(self.decode)


@dataclass
class DecodeSpeedOptions:
    """``speed.*`` of ``draftheads speed``: batch sizes, prompt count, dynamic-tree settings to compare.

    A batch holds at most ``prompts`` prompts, so every batch size is at most ``prompts``.
    """

    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 8])
    prompts: int = 8
    # dynamic-tree settings (Li et al., 2024) [top_k_draft, depth, total_tokens], one table each; empty:
    # decode.* as set
    dynamic: list[list[int]] = field(default_factory=list)
    # also print the verify-cost curve (1..64 new tokens) of eager and of decode.backend
    curve: bool = False
    # the workload rows (bench/workloads.py): backend choice, batches, long and copy prompts, sampling
    workloads: bool = False
    long_prompts: int = 8
    copy_per_category: int = 2
    temperatures: list[float] = field(default_factory=lambda: [0.7, 1.0])
    # the sampling rows' prompts: prompt set names or prompt files (a named set absent here is left out)
    sampling_sets: list[str] = field(default_factory=lambda: ["heldout", "spec_bench"])
    # with workloads: the JSON file (docs/benchmarks.json) whose ``workloads`` key gets the rows
    figures: str | None = None

    def __post_init__(self) -> None:
        """Refuse batch sizes, prompt counts and tree settings no measurement can use, before the
        target loads."""
        at_least("speed.prompts", self.prompts, 1, 8)
        sizes = list(self.batch_sizes)
        if not sizes or min(sizes) < 1:
            raise UserError(
                f"speed.batch_sizes={sizes} needs batch sizes >= 1; use e.g. speed.batch_sizes=[1,4,8]"
            )
        if len(set(sizes)) != len(sizes):
            once = sorted(set(sizes))
            raise UserError(
                f"speed.batch_sizes={sizes} lists a batch size twice, which would be measured twice; "
                f"use speed.batch_sizes=[{','.join(map(str, once))}]"
            )
        if max(sizes) > self.prompts:
            fit = [b for b in sizes if b <= self.prompts] or [self.prompts]
            raise UserError(
                f"speed.batch_sizes={sizes} has a batch of {max(sizes)}, more than the {self.prompts} prompts "
                f"(speed.prompts); use speed.prompts={max(sizes)} or speed.batch_sizes=[{','.join(map(str, fit))}]"
            )
        for setting in self.dynamic:
            check_dynamic(list(setting))
        at_least("speed.long_prompts", self.long_prompts, 1, 8)
        at_least("speed.copy_per_category", self.copy_per_category, 1, 2)
        check_temperatures("speed.temperatures", list(self.temperatures))
        for source in self.sampling_sets:  # a named set, or a prompt file as eval.prompts reads them
            if not Path(str(source)).expanduser().is_file():
                one_of("speed.sampling_sets", source, [*PROMPT_SETS, "or a prompt file (.jsonl, .json, ...)"])
        if self.figures is not None and not self.figures.strip():
            raise UserError(
                "speed.figures is empty; give the JSON file for the rows (e.g. speed.figures=docs/benchmarks.json), "
                "or drop it"
            )
        if self.figures is not None and not self.workloads:
            raise UserError("speed.figures is written by the workload rows; add speed.workloads=true")


@dataclass
class SpeedArgs:
    """``draftheads speed``: tokens/s of speculative against plain greedy decoding, per batch size."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=lambda: DecodeConfig(max_new_tokens=64))
    heads: str | None = None
    revision: str | None = None
    speed: DecodeSpeedOptions = field(default_factory=DecodeSpeedOptions)

    def __post_init__(self) -> None:
        """Refuse an unwritable verify-cost cache and a run in which nothing drafts (batches are
        ``speed.batch_sizes``)."""
        cost_cache_writable(self.decode)
        something_drafts(self.heads, self.decode)


@dataclass
class TrainSpeedOptions:
    """``speed.*`` of ``draftheads train-speed``: the feature cache and how much of it to train on."""

    cache: str = "outputs/bench/teacher"
    tokens: int = 8000
    steps: int = 8
    # train.pack_micro_batches of the run (false: every micro-batch padded to its longest row)
    pack: bool = True

    def __post_init__(self) -> None:
        """Refuse a run that trains nothing, naming the ``speed.*`` key (not the recipe's)."""
        if not str(self.cache or "").strip():
            raise UserError(
                "speed.cache is empty; give a feature cache, e.g. speed.cache=outputs/bench/teacher"
            )
        at_least("speed.tokens", self.tokens, 1, 8000)
        at_least("speed.steps", self.steps, 1, 8)


@dataclass
class TrainSpeedArgs:
    """``draftheads train-speed``: training tokens/s of the bench recipe on a feature cache."""

    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    speed: TrainSpeedOptions = field(default_factory=TrainSpeedOptions)


@dataclass
class DataSpeedOptions:
    """``speed.*`` of ``draftheads data-speed``: how many tokens to extract features for, and how
    (``topk > 0``: the bench's row base's training layers and the target's top-k logits, as the bench's
    teacher-forced cache; else the last layer alone); with ``distill_prompts > 0``, greedy
    distillation of that many training prompts (batches of ``distill_batch_size``,
    ``distill_new_tokens`` new tokens) by the decoder's batched loop and by transformers'
    ``generate``, both on ``data.distill.backend``. ``feature_tokens=0`` skips feature extraction
    and ``distill_prompts=0`` (the default) distillation."""

    feature_tokens: int = 20000
    batch_tokens: int = 4096
    dtype: str = "bfloat16"
    topk: int = 0
    distill_prompts: int = 0
    distill_batch_size: int = 32
    distill_new_tokens: int = 128

    def __post_init__(self) -> None:
        """Refuse sizes no measurement can use before the target loads, naming the ``speed.*`` key."""
        at_least("speed.feature_tokens", self.feature_tokens, 0, "20000 (0: no feature extraction)")
        at_least("speed.batch_tokens", self.batch_tokens, 1, 4096)
        one_of("speed.dtype", self.dtype, STORE_DTYPES)
        at_least("speed.topk", self.topk, 0, 64)
        at_least("speed.distill_prompts", self.distill_prompts, 0, "96 (0: no distillation)")
        at_least("speed.distill_batch_size", self.distill_batch_size, 1, 32)
        at_least("speed.distill_new_tokens", self.distill_new_tokens, 1, 128)


@dataclass
class DataSpeedArgs:
    """``draftheads data-speed``: tokens/s of tokenising + masking and of feature extraction."""

    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(max_length=512))
    speed: DataSpeedOptions = field(default_factory=DataSpeedOptions)

    def __post_init__(self) -> None:
        """Refuse a distillation backend the target cannot run on, naming ``data.distill.backend``."""
        distill_backend_fits(self.target, self.data)


ENGINE_FORMATS = ("vllm", "speculators")


@dataclass
class EngineOptions:
    """``engine.*`` of ``draftheads engine``: the prompt set and count, the export ``format``
    (none: both, speculators where the drafter has that form), the ``chain`` drafted per step
    (none: the model card's) and the JSON file ``out`` that receives the record."""

    prompts: str = "heldout"
    max_prompts: int = 8
    format: str | None = None
    chain: int | None = None
    out: str | None = None

    def __post_init__(self) -> None:
        """Refuse a prompt set, count, format or chain no run can use, before anything loads."""
        one_of("engine.prompts", self.prompts, PROMPT_SETS)
        at_least("engine.max_prompts", self.max_prompts, 1, 8)
        if self.format is not None:
            one_of("engine.format", self.format, ENGINE_FORMATS)
        at_least("engine.chain", self.chain, 1, 3)
        if self.out is not None and not self.out.strip():
            raise UserError("engine.out is empty; give a JSON file (e.g. engine.out=engine.json), or drop it")


@dataclass
class EngineArgs:
    """``draftheads engine``: vLLM's acceptance beside draftheads' decoder, same chain, same ids."""

    target: TargetConfig = field(default_factory=TargetConfig)
    decode: DecodeConfig = field(default_factory=lambda: DecodeConfig(max_new_tokens=64))
    heads: str | None = None
    revision: str | None = None
    engine: EngineOptions = field(default_factory=EngineOptions)

    def __post_init__(self) -> None:
        """``decode.backend=auto`` decodes with ``eager``: auto times both backends first (minutes on
        a busy CPU), and the run compares acceptance counts, which the backend does not change."""
        if self.decode.backend == "auto":
            self.decode = replace(self.decode, backend="eager")


def distill_backend_fits(target: TargetConfig, data: DataConfig) -> None:
    """``data.distill.backend`` can run the target as configured (before anything loads)."""
    backend_fits("data.distill.backend", data.distill.backend, target.device, target.dtype)


def check_dynamic(setting: list[int]) -> None:
    """One ``speed.dynamic`` entry: ``[top_k_draft, depth, total_tokens]``, each in range."""
    example = "e.g. speed.dynamic=[[4,4,8],[4,5,12]]"
    if len(setting) != 3:
        raise UserError(f"speed.dynamic entry {setting}: give [top_k_draft,depth,total_tokens]; {example}")
    k, depth, total = setting
    if k < 1 or depth < 1 or total < 2:
        raise UserError(
            f"speed.dynamic entry {setting}: top_k_draft and depth must be >= 1 and total_tokens >= 2; {example}"
        )


ROOT_FIELDS = frozenset(f.name for f in fields(Config))


def own_keys(args_type: type) -> frozenset[str]:
    """The top-level keys of ``args_type`` that the root config does not carry (its options)."""
    return frozenset(f.name for f in fields(args_type)) - ROOT_FIELDS


def from_config(args_type: type, cfg: Config, options: dict[str, object] | None = None):
    """The command's arguments, taken from the composed root config (and its own options)."""
    values = {f.name: getattr(cfg, f.name) for f in fields(args_type) if f.name in ROOT_FIELDS}
    args = args_type(**values, **(options or {}))
    offload_writable(getattr(args, "target", None))
    return args


def offload_writable(target: TargetConfig | None) -> None:
    """Refuse a ``target.offload_folder`` that is a file or cannot be created or written, before the
    target loads (accelerate would fail part-way through placing its weights). Changes nothing."""
    from draftheads.data.outdir import writable_dir

    if target is not None and target.offload_folder:
        writable_dir(target.offload_folder, "target.offload_folder")


def to_config(args) -> Config:
    """A root :class:`Config` holding ``args`` (defaults elsewhere), for code that takes one."""
    return Config(**{f.name: getattr(args, f.name) for f in fields(args) if f.name in ROOT_FIELDS})
