"""The whole typed config: one dataclass per Hydra group, composed into :class:`Config`.

Config flows one way: Hydra composes ``conf/config.yaml`` and the group files, OmegaConf
checks every key and type against these dataclasses, and ``OmegaConf.to_object`` turns
the result into plain dataclass objects that the commands read. Nothing is global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftheads.conf.schema.data import DataConfig
from draftheads.conf.schema.decode import DecodeConfig, EvalConfig
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from draftheads.conf.schema.train import LoggerConfig, TrainConfig


@dataclass
class BenchConfig:
    """``draftheads bench`` / ``draftheads demo``: the end-to-end pipeline on the embedded target.

    Stages cache their outputs under ``out_dir`` (distilled data, features, drafters, reports),
    so a rerun skips what is done. ``shared_data`` is the development data folder (Spec-Bench,
    GSM8K, CodeAlpaca); absent, those sets are skipped with a message.
    """

    out_dir: str = "outputs/bench"
    shared_data: str = "../shared/data"
    # distillation: prompts answered greedily by the target (embedded train split, plus GSM8K
    # train and CodeAlpaca when shared_data exists), and target-written prompts
    distill_prompts: int = 1500
    self_prompts: int = 256
    distill_new_tokens: int = 192
    distill_batch_size: int = 32
    drafters: list[str] = field(default_factory=lambda: ["medusa", "eagle3"])
    medusa_steps: int = 1500
    eagle_steps: int = 1500
    # tau against training tokens (EAGLE drafter), each point a fresh run on a subset
    scaling_tokens: list[int] = field(default_factory=lambda: [30000, 100000, 300000])
    scaling_steps_per_10k_tokens: int = 40
    eval_sets: list[str] = field(default_factory=lambda: ["heldout", "spec_bench", "gsm8k_test"])
    eval_prompts: int = 20
    spec_bench_per_category: int = 2
    eval_new_tokens: int = 128
    # run once, with the first drafter (they do not depend on the drafter)
    baselines: list[str] = field(default_factory=lambda: ["pld"])
    docs: str = "docs/benchmarks.md"


@dataclass
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: dict[str, Any] = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    # Command arguments (which command reads which is listed in `draftheads --help`).
    heads: str | None = None
    revision: str | None = None
    prompt: str | None = None
    repo_id: str | None = None
    private: bool = False
    format: str | None = None
    out: str | None = None


def register() -> None:
    """Make the schema known to Hydra as ``base_config`` (idempotent).

    ``data.fields`` maps field names to columns, so its node stays open to new keys:
    ``data.fields.text=body`` works without Hydra's ``+`` (DataConfig checks the names).
    """
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    node = OmegaConf.structured(Config)
    OmegaConf.set_struct(node.data.fields, False)
    ConfigStore.instance().store(name="base_config", node=node)
