"""Hydra composition of the typed root config, with every failure reduced to one line."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.conf.schema.checks import finite

CONF_DIR = Path(__file__).resolve().parent.parent
GROUPS = ("target", "draft", "data", "train", "deepspeed", "logger", "decode", "eval", "recipe")


def group_options(group: str) -> list[str]:
    """The option names of a config group (its YAML files under ``conf/<group>/``)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(overrides: list[str]):
    """Compose and validate the config; returns the typed :class:`Config` and its DictConfig.

    The drafter's keys are checked against the kinds' sections, and flat ones moved into the
    chosen kind's (:mod:`draftheads.conf.commands.draft_keys`)."""
    from draftheads.conf.commands.draft_keys import compose_draft

    return compose_draft(overrides, compose_checked)


def compose_checked(overrides: list[str]):
    """Compose and validate the config from overrides in its own spelling."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from draftheads.conf.schema import Config, register

    register()
    check_booleans(Config, overrides)
    check_nested_lists(Config, overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="draftheads.conf", version_base="1.3"):
            dcfg = hydra_compose(config_name="config", overrides=overrides)
        finite(OmegaConf.to_container(dcfg, resolve=True), root=Config)
        return OmegaConf.to_object(dcfg), dcfg
    except UserError:
        raise
    except Exception as e:  # Hydra/OmegaConf errors: reduce them to one line
        raise UserError(config_error_line(e, overrides=overrides)) from None
    finally:
        GlobalHydra.instance().clear()


# What OmegaConf reads as a boolean from text; any other number it would also take (2 as true).
BOOLEAN_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "y", "n", "1", "0"})


def field_type(root: type, key: str) -> object:
    """The declared type of dotted ``key`` under dataclass ``root`` (None: not a typed field)."""
    kind: object = root
    for part in key.split("."):
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            return None
        kind = typing.get_type_hints(kind).get(part)
    return kind


def check_booleans(root: type, overrides: list[str], prefix: str = "") -> None:
    """Refuse ``key=VALUE`` for a boolean key of ``root`` when VALUE is no boolean word
    (OmegaConf would take ``decode.cost_aware=2`` as true); ``prefix`` is the options group of a
    command's own keys, as in :func:`config_error_line`."""
    for item in overrides:
        key, eq, value = item.lstrip("+~").partition("=")
        kind = field_type(root, key)
        if not eq or kind not in (bool, bool | None):
            continue
        word = value.strip().strip("'\"").lower()
        if word not in BOOLEAN_WORDS and not (kind is not bool and word in ("null", "none", "")):
            raise UserError(typed_value_line(f"{prefix}{key}", value, "is not a valid bool"))


def check_nested_lists(root: type, overrides: list[str], prefix: str = "") -> None:
    """Refuse ``key=[1,2,3]`` for a key of ``root`` that holds a list of lists (OmegaConf's error
    names no key); ``prefix`` as in :func:`check_booleans`."""
    for item in overrides:
        key, eq, value = item.lstrip("+~").partition("=")
        kind = field_type(root, key)
        inner = (
            typing.get_args(kind)[0] if typing.get_origin(kind) is list and typing.get_args(kind) else None
        )
        if not eq or typing.get_origin(inner) is not list:
            continue
        text = value.strip()
        if text.startswith("[") and text[1:].lstrip()[:1] not in ("[", "]"):
            raise UserError(
                f"{prefix}{key}={text} is a list of lists; put each entry in its own brackets: "
                f"'{prefix}{key}=[{text}]'"
            )


def missing_option_line(msg: str) -> str | None:
    """For "Could not find 'group/name'": the line listing that group's real options."""
    import re

    m = re.search(r"Could not (?:find|load) '([\w-]+)/([^']*)'", msg)
    if not m or m.group(1) not in GROUPS:
        return None
    group, name = m.groups()
    return f"{group}={name} is not a {group} option; use one of {'|'.join(group_options(group))}"


def config_error_line(e: BaseException, prefix: str = "", overrides: Sequence[str] = ()) -> str:
    """One line from a Hydra/OmegaConf composition error, naming the key as the user typed it
    (``prefix`` is the options group of a command's own keys, e.g. ``speed.``; ``overrides``, the
    command line's, give the whole override that reached the missing key)."""
    err = e
    while err.__cause__ is not None and not getattr(err, "full_key", None):
        err = err.__cause__
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    key = f"{prefix}{err.full_key}" if getattr(err, "full_key", None) else None
    if "not in" in msg or "Key '" in msg and "not" in msg:
        if key and key.startswith("deepspeed."):  # the group is DeepSpeed's own config: any key may be added
            typed = next((o for o in overrides if o.startswith((f"{key}=", f"{key}."))), f"{key}=VALUE")
            return f"{key} is not in the deepspeed group's file; add a DeepSpeed key with +{typed}"
        return f"unknown config key {key or msg}: {msg}; run `draftheads <command> --help` to see its keys"
    if "Could not find" in msg or "Could not load" in msg:
        return missing_option_line(msg) or f"{msg}; check the group option name"
    if key:
        return typed_value_line(key, getattr(err, "value", None), msg) or f"bad value for {key}: {msg}"
    return f"invalid config: {msg}"


def typed_value_line(key: str, value: object, msg: str) -> str | None:
    """The line for a value of the wrong shape: a word where a list goes, a non-boolean."""
    if "is not a ListConfig" in msg:
        return f"{key}={value} is not a list; write it in brackets: '{key}=[{value}]'"
    if "is not a valid bool" in msg:
        return f"{key}={value} is not a boolean; use {key}=true or {key}=false"
    return None
