"""Typed configs of decoding and evaluation (Hydra groups ``decode/`` and ``eval/``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeConfig:
    max_new_tokens: int = 128
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    tree: str = "auto"
    dynamic: bool = True
    top_k_draft: int = 4
    depth: int = 4
    total_tokens: int = 8
    typical: bool = False
    stop: list[str] | None = None
    batch_size: int = 1


@dataclass
class EvalConfig:
    output_dir: str = "outputs/eval"
    max_prompts: int | None = None
    baselines: list[str] | None = None
    assistant_model: str | None = None
