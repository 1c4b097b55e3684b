"""What vLLM's and SGLang's drafter loaders read, written out once, and a checker for it.

Each kind's folder says, in its ``engine.py``, what the engines' loaders of its layouts read: the
config class and fields, the tensor names and shapes (``docs/hub.md`` tabulates them all).

:data:`FORMATS` holds each loader's config fields, tensor names, shapes and dtypes;
:data:`RULES` holds the loaders' further rules, each with the engine source file it comes from.
Both are gathered here from each kind's ``formats`` and ``rules``
(:mod:`draftheads.heads.kinds`), written in its folder's ``engine.py`` in the terms of
:mod:`~draftheads.heads.engine.spec`, with the engine source files and commits its rules were
read from.
:func:`validate_export` checks a directory against both, strictly: the engines skip unknown keys
silently (vLLM drops ``fc.bias``), so an extra key is an error here. This is a check of names,
shapes, dtypes and these rules, not an engine load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from draftheads.conf.errors import UserError
from draftheads.heads.checkpoint import CONFIG_NAME, WEIGHTS_NAME
from draftheads.heads.engine.spec import EngineFormat, Rule, TensorRule
from draftheads.heads.kinds import KINDS

ENGINES = ("vllm", "sglang")
# gathered from the kinds of BUILTIN_KINDS (their heads facts load on first use)
FORMATS: dict[tuple[str, str], EngineFormat] = {
    key: f for kind in KINDS.values() for key, f in kind.formats.items()
}
RULES: tuple[Rule, ...] = tuple(rule for kind in KINDS.values() for rule in kind.rules)


def rules_for(engine: str, method: str) -> list[Rule]:
    """The rules that apply to ``engine``'s ``method`` loader."""
    return [r for r in RULES if (engine, method) in r.methods]


# ---- validation -------------------------------------------------------------------------------
def format_of(config: dict[str, Any], engine: str) -> EngineFormat:
    """The engine format that ``config`` declares (by model_type and architectures)."""
    arch = (config.get("architectures") or [None])[0]
    for (eng, _), fmt in FORMATS.items():
        if eng == engine and fmt.model_type == config.get("model_type") and fmt.architectures == [arch]:
            return fmt
    raise UserError(
        f"config.json (model_type {config.get('model_type')!r}, architectures {[arch]}) is not a {engine} "
        "drafter format draftheads knows"
    )


def _dtype_ok(t: torch.Tensor, family: str) -> bool:
    if family == "int64":
        return t.dtype == torch.int64
    if family == "bool":
        return t.dtype == torch.bool
    return t.is_floating_point()


def tensor_problems(tensors: dict[str, torch.Tensor], rules: dict[str, TensorRule]) -> list[str]:
    """Every way ``tensors`` differs from ``rules``: missing, unexpected, wrong shape or dtype."""
    problems = [f"missing {k}" for k, r in rules.items() if r.required and k not in tensors]
    problems += [f"unexpected {k} (the engine would skip it)" for k in tensors if k not in rules]
    for k, t in tensors.items():
        r = rules.get(k)
        if r is None:
            continue
        if tuple(t.shape) != r.shape:
            problems.append(f"{k} has shape {tuple(t.shape)}, the engine builds {r.shape}")
        elif not _dtype_ok(t, r.dtype):
            problems.append(f"{k} has dtype {t.dtype}, the engine expects {r.dtype}")
    return problems


def config_problems(config: dict[str, Any], fmt: EngineFormat, target_layers: int | None = None) -> list[str]:
    """Missing or forbidden config fields for ``fmt``, then every broken :data:`RULES` entry (with its source)."""
    problems = [f"config.json lacks {f}" for f in fmt.config_fields if config.get(f) is None]
    problems += [
        f"config.json must not set {f} for {fmt.engine}" for f in fmt.forbidden_config if f in config
    ]
    if problems:
        return problems
    for rule in rules_for(fmt.engine, fmt.method):
        problem = rule.check(config, target_layers)
        if problem:
            problems.append(f"{problem} ({rule.sources[0]})")
    return problems


def validate_export(
    directory: str | os.PathLike, engine: str, target_layers: int | None = None
) -> EngineFormat:
    """Check an exported directory against the engine's spec and rules; returns its format or raises.

    ``target_layers`` (the target's depth) enables the aux-layer range check.
    """
    directory = Path(directory)
    cfg_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not cfg_path.is_file() or not weights.is_file():
        raise UserError(f"{directory}: an engine drafter needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        config = json.loads(cfg_path.read_text())
        tensors = load_file(str(weights))
    except (json.JSONDecodeError, SafetensorError, OSError) as e:
        raise UserError(f"{directory}: unreadable export ({e})") from None
    fmt = format_of(config, engine)
    problems = config_problems(config, fmt, target_layers)
    if not problems:
        problems = tensor_problems(tensors, fmt.tensors(config))
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UserError(f"{directory} does not match {engine} {fmt.method}: {'; '.join(problems[:3])}{more}")
    return fmt
