"""The whole typed config: one dataclass per Hydra group, composed into :class:`Config`.

Config flows one way: Hydra composes ``conf/config.yaml`` and the group files, OmegaConf
checks every key and type against these dataclasses, and ``OmegaConf.to_object`` turns
the result into plain dataclass objects that the commands read. Nothing is global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftheads.data.config import DataConfig
from draftheads.decode.config import DecodeConfig, EvalConfig
from draftheads.heads.config import DraftConfig, TargetConfig
from draftheads.train.config import LoggerConfig, TrainConfig


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
    # Command arguments (which command reads which is listed in `draftheads --help`).
    heads: str | None = None
    revision: str | None = None
    prompt: str | None = None
    repo_id: str | None = None
    private: bool = False
    format: str | None = None
    out: str | None = None


def register() -> None:
    """Make the schema known to Hydra as ``base_config`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=Config)
