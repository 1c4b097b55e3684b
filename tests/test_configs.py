"""Every YAML under conf/ composes with the typed schema, and every value it sets arrives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from draftheads.conf.cli import compose
from draftheads.conf.commands.compose import CONF_DIR, GROUPS, group_options

OPTIONS = [(g, o) for g in GROUPS for o in group_options(g)]
# target=hf names no model of its own: the user must give one
REQUIRED = {("target", "hf"): ["target.name_or_path=org/model"]}
# groups whose files set keys all over the config (``# @package _global_``), chosen by no default
GLOBAL = {"recipe"}


def leaves(value, prefix: str = ""):
    """``(dotted key, value)`` for every scalar or list in a nested YAML mapping."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, value


def lookup(obj, dotted: str):
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def test_every_group_option_is_found():
    for name in ("zero2_offload", "zero3"):
        assert ("deepspeed", name) in OPTIONS
    for group, name in [("data", "broad"), ("data", "self"), ("decode", "sample"), ("decode", "typical")]:
        assert (group, name) in OPTIONS
    assert {o for g, o in OPTIONS if g == "target"} >= {"hf", "smollm2", "tiny-llama", "tiny-gpt2"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_group_option_composes_with_the_schema(group, option):
    cfg, _ = compose([f"{group}={option}", *REQUIRED.get((group, option), [])])
    typed = cfg if group in GLOBAL else getattr(cfg, group)
    if group != "deepspeed":
        assert dataclasses.is_dataclass(typed)
    written = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    written.pop("defaults", None)
    for key, value in leaves(written):
        if (group, option) in REQUIRED and key == "name_or_path":
            continue
        if isinstance(value, str) and value.startswith("${"):  # an interpolation: its target is checked
            continue
        assert lookup(typed, key) == value, f"{group}/{option}.yaml: {key}"


def test_the_root_config_composes_with_its_defaults():
    cfg, _ = compose([])
    root = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "config.yaml"))
    chosen = [next(iter(d.items())) for d in root["defaults"] if isinstance(d, dict)]
    assert {g for g, _ in chosen} == set(GROUPS)
    for group, option in chosen:
        assert option in group_options(group) or (group in GLOBAL and option is None)
    assert cfg.target.name_or_path and cfg.draft.kind and cfg.data.path


def test_every_draft_section_is_a_kinds():
    """Each ``draft.*`` field beside ``kind`` is the section of a declared kind, holding that
    kind's keys (a section no kind reads would be refused on every kind)."""
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.conf.schema.kinds import DRAFT_KINDS

    sections = {f.name for f in dataclasses.fields(DraftConfig)} - {"kind"}
    assert sections == set(DRAFT_KINDS)
    for kind in DRAFT_KINDS.values():
        assert kind.keys == tuple(f.name for f in dataclasses.fields(kind.schema))
