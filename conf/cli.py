"""``draftheads <command> [overrides]``: the one command line.

Each command reads only its own keys (:mod:`draftheads.conf.commands`): the overrides are
checked against the command's argument dataclass, the Hydra config in this package is composed
and validated against :class:`draftheads.conf.schema.Config`, and the command's typed
arguments are handed to its function. ``--cfg job`` prints them instead; ``--help`` lists them.

Free text does not go through Hydra's override grammar: ``prompt=TEXT``, ``--prompt TEXT`` and
``prompt_file=PATH`` are taken as typed (commas, quotes, emoji, newlines and all).

A user error (a bad key or value, a missing file, a wrong checkpoint) prints one line and
exits non-zero; set ``DRAFTHEADS_DEBUG=1`` to see the traceback.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftheads.conf.commands import COMMANDS, EXAMPLE_DRAFT, OLD_SPELLINGS, SCHEMA_NAMES, USER_NAMES, Command
from draftheads.conf.commands.args import ROOT_FIELDS, from_config, own_keys
from draftheads.conf.commands.compose import (
    GROUPS,
    check_booleans,
    check_nested_lists,
    compose,
    config_error_line,
    group_options,
)
from draftheads.conf.errors import UserError
from draftheads.conf.schema.checks import finite

__all__ = ["compose", "main", "parse", "Invocation"]

# Commands whose finished work survives Ctrl-C (checkpoints, shards, cached stages).
RESUMABLE = frozenset({"train", "distill", "bench", "demo"})
RESUME_NOTE = "; completed work is saved, rerun the same command to resume"


@dataclass
class Invocation:
    """A parsed command line: the command, its typed arguments, and what to do with them."""

    command: str
    args: Any
    show_cfg: bool = False


def usage() -> str:
    lines = ["usage: draftheads <command> [key=value ...] [--help] [--cfg job]", "", "commands:"]
    for name, c in COMMANDS.items():
        lines.append(f"  {name:<12} {c.help}")
        lines.append(f"  {'':<12}   e.g. {c.example}")
    lines += [
        "",
        f"config groups: {', '.join(GROUPS)} (e.g. {EXAMPLE_DRAFT} target=tiny-llama)",
        "`draftheads <command> --help` lists the keys that command reads;",
        "`draftheads <command> --cfg job` prints their resolved values.",
    ]
    return "\n".join(lines)


def user_name(key: str) -> str:
    return USER_NAMES.get(key, key)


def key_lines(prefix: str, value: Any) -> list[str]:
    """``key = default`` lines for every leaf of a dataclass value (user spellings)."""
    if not dataclasses.is_dataclass(value):
        return [f"    {user_name(prefix)} = {value!r}"]
    lines = []
    for f in dataclasses.fields(value):
        lines += key_lines(f"{prefix}.{f.name}", getattr(value, f.name))
    return lines


def draft_key_lines(d: Any) -> list[str]:
    """``draft.kind`` and the ``draft.<kind>.key = default`` lines of the chosen kind's section,
    and how to list another kind's."""
    lines = key_lines("draft.kind", d.kind) + key_lines(f"draft.{d.kind}", d.section)
    return lines + [f"    (the keys of draft.kind={d.kind}; `draft=<group> --help` lists another kind's)"]


def command_help(name: str, groups: list[str] | None = None) -> str:
    """The command's keys with their default values, group options first; ``draft.*`` lists the
    chosen kind's keys only (``groups``: group choices typed beside ``--help``, ``draft=<group>``)."""
    c = COMMANDS[name]
    cfg = compose(list(groups or []))[0]
    args = from_config(c.args, cfg)
    lines = [f"draftheads {name}: {c.help}", f"  e.g. {c.example}", "", "keys (override as key=value):"]
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if f.name in GROUPS:
            lines.append(f"  {f.name}=<{'|'.join(group_options(f.name))}>")
        if f.name == "draft":
            lines += draft_key_lines(value)
        elif dataclasses.is_dataclass(value):
            lines += key_lines(f.name, value)
        else:
            lines.append(f"  {user_name(f.name)} = {value!r}")
    lines = [line for line in lines if line.split(" = ")[0].strip() not in c.hints]
    if "prompt" in {f.name for f in dataclasses.fields(args)}:
        lines.append('  free text: prompt="..." | --prompt "..." | prompt_file=PATH')
    return "\n".join(lines)


def read_prompt_file(typed: str) -> str:
    """The text of ``prompt_file=PATH``: UTF-8, a leading byte-order mark dropped (as a text editor
    does); a missing, unreadable, binary or empty file is refused in one line."""
    path = Path(typed).expanduser()
    if not path.is_file():
        raise UserError(f"prompt_file={typed}: no such file; give the path of a UTF-8 text file")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(
            f"prompt_file={typed} is not UTF-8 text (a binary file?); give a UTF-8 text file"
        ) from None
    except OSError as e:
        raise UserError(
            f"prompt_file={typed} cannot be read ({e.strerror or e}); give a readable text file"
        ) from None
    if not text.strip():
        raise UserError(f'prompt_file={typed} is empty; write the prompt into it, or pass prompt="..."')
    return text


def take_free_text(rest: list[str]) -> tuple[list[str], str | None]:
    """Remove ``prompt=``, ``--prompt[=]`` and ``prompt_file=`` from ``rest``; returns the prompt.

    Two sources of one prompt (``prompt=`` and ``prompt_file=``, or either twice) are refused:
    silently taking one would answer a prompt the user did not mean."""
    out, found, i = [], [], 0
    while i < len(rest):
        item = rest[i]
        if item == "--prompt":
            if i + 1 >= len(rest):
                raise UserError('--prompt needs the text after it: --prompt "..."')
            found.append(("--prompt", rest[i + 1]))
            i += 2
            continue
        if item.startswith(("--prompt=", "prompt=")):
            found.append((item.split("=", 1)[0], item.split("=", 1)[1]))
        elif item.startswith("prompt_file="):
            found.append(("prompt_file", item.split("=", 1)[1]))
        else:
            out.append(item)
        i += 1
    if len(found) > 1:
        keys = list(dict.fromkeys(k for k, _ in found))
        given = (
            f"{' and '.join(keys)} both give"
            if len(keys) > 1
            else f"{keys[0]} is given {len(found)} times for"
        )
        raise UserError(f"{given} the prompt; pass one of prompt=TEXT, --prompt TEXT or prompt_file=PATH")
    if not found:
        return out, None
    key, value = found[0]
    return out, read_prompt_file(value) if key == "prompt_file" else value


def refusal(name: str, c: Command, key: str, value: str) -> str:
    """The one line that refuses ``key`` for command ``name``, naming the key to use instead."""
    top = key.split(".")[0]
    for pattern in (key, top):
        if pattern in c.hints:
            return c.hints[pattern].format(key=key, value=value or "X", command=name)
    leaf = key.split(".")[-1]
    for f in dataclasses.fields(c.args):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) and leaf in {g.name for g in dataclasses.fields(default)}:
            return f"{name} does not read {key}; use {user_name(f'{f.name}.{leaf}')}={value}"
    keys = ", ".join(user_name(f.name) for f in dataclasses.fields(c.args))
    return f"{name} does not read {key}; it reads {keys} (see `draftheads {name} --help`)"


def split_override(item: str) -> tuple[str, str, str]:
    """``(prefix, key, value)`` of a Hydra override such as ``+data.fields.text=body``."""
    prefix = item[: len(item) - len(item.lstrip("+~"))]
    body = item[len(prefix) :]
    key, _, value = body.partition("=")
    return prefix, key, value


def check_brace_expansion(rest: list[str]) -> None:
    """Refuse one key given several times as ``item:value`` (``target.device_map=lm_head:1``
    twice or more): bash expanded an unquoted ``key={a:1,b:2}`` into one override per item, and
    each would replace the one before; the line shows the quoted override."""
    values: dict[str, list[str]] = {}
    for item in rest:
        _, key, value = split_override(item)
        values.setdefault(key, []).append(value)
    for key, given in values.items():
        if len(given) > 1 and all(":" in v and not v.startswith(("{", "[")) for v in given):
            raise UserError(
                f"{key} is given {len(given)} times ({', '.join(given)}): the shell expanded an unquoted "
                f"{{...}} into one override per item; quote the mapping: '{key}={{{','.join(given)}}}'"
            )


def check_overrides(name: str, c: Command, rest: list[str]) -> tuple[list[str], list[str]]:
    """Hydra overrides (in schema spelling) and the command's own options, or a one-line refusal."""
    check_brace_expansion(rest)
    read = {f.name for f in dataclasses.fields(c.args)}
    own = own_keys(c.args)
    hydra, options = [], []
    for item in rest:
        if item.startswith("-"):
            raise UserError(f"unknown flag {item}; run `draftheads {name} --help`")
        prefix, key, value = split_override(item)
        if "=" not in item and not prefix.startswith("~"):
            raise UserError(f"{item!r} is not key=value; run `draftheads {name} --help` for the keys")
        if key in OLD_SPELLINGS:
            raise UserError(f"{key} is now {OLD_SPELLINGS[key]}; use {OLD_SPELLINGS[key]}={value}")
        key = SCHEMA_NAMES.get(key, key)
        top = key.split(".")[0]
        if key in c.hints:
            raise UserError(refusal(name, c, key, value))
        if top in own:
            options.append(f"{key}={value}")
            continue
        if top not in read or top not in ROOT_FIELDS:
            raise UserError(refusal(name, c, key, value))
        if key == "decode.tree" and value.startswith("["):
            value = f"'{value}'"  # a choices list is the tree's text, not a Hydra list
        hydra.append(f"{prefix}{key}={value}" if "=" in item else f"{prefix}{key}")
    return hydra, options


def own_options(c: Command, options: list[str]) -> dict[str, Any]:
    """The command's own option groups (e.g. ``speed.*``), typed by its argument dataclass."""
    from omegaconf import OmegaConf

    result = {}
    for f in dataclasses.fields(c.args):
        if f.name not in own_keys(c.args):
            continue
        # ``key=`` is the empty string, as Hydra reads it for the root keys (OmegaConf's dotlist: None)
        mine = [
            o.split(".", 1)[1] + ("''" if o.endswith("=") else "")
            for o in options
            if o.split(".")[0] == f.name
        ]
        check_booleans(type(f.default_factory()), mine, prefix=f"{f.name}.")
        check_nested_lists(type(f.default_factory()), mine, prefix=f"{f.name}.")
        try:
            base = OmegaConf.structured(f.default_factory())
            merged = OmegaConf.merge(base, OmegaConf.from_dotlist(mine))
            finite(OmegaConf.to_container(merged), f"{f.name}.", type(f.default_factory()))
            result[f.name] = OmegaConf.to_object(merged)
        except UserError:
            raise
        except Exception as e:  # OmegaConf errors: one line naming the key as typed (speed.curve)
            raise UserError(config_error_line(e, prefix=f"{f.name}.")) from None
    return result


def parse(argv: list[str]) -> Invocation:
    """Check and compose ``draftheads <command> [overrides]`` without running it."""
    if not argv or argv[0] not in COMMANDS:
        got = repr(argv[0]) if argv else "nothing"
        raise UserError(f"unknown command {got}; run `draftheads --help` for the list")
    name, rest = argv[0], list(argv[1:])
    c = COMMANDS[name]
    show_cfg = "--cfg" in rest
    if show_cfg:
        i = rest.index("--cfg")
        del rest[i : i + 2]
    rest, prompt = take_free_text(rest)
    if prompt is not None and "prompt" not in {f.name for f in dataclasses.fields(c.args)}:
        raise UserError(refusal(name, c, "prompt", "TEXT"))
    hydra, options = check_overrides(name, c, rest)
    cfg, _ = compose(hydra)
    if prompt is not None:
        cfg.prompt = prompt
    return Invocation(name, from_config(c.args, cfg, own_options(c, options)), show_cfg)


def own_draft_keys(draft: dict[str, Any]) -> dict[str, Any]:
    """``draft.kind`` and that kind's section (the other sections are unset)."""
    return {"kind": draft["kind"], draft["kind"]: draft[draft["kind"]]}


def as_yaml(args: Any) -> str:
    """The arguments as YAML, in the command line's spelling."""
    from omegaconf import OmegaConf

    data = dataclasses.asdict(args)
    if isinstance(data.get("draft"), dict):
        data["draft"] = own_draft_keys(data["draft"])
    for schema, user in USER_NAMES.items():
        *parents, leaf = schema.split(".")
        node = data
        for p in parents:
            node = node.get(p, {})
        if leaf in node:
            node[user.split(".")[-1]] = node.pop(leaf)
    return OmegaConf.to_yaml(OmegaConf.create(data))


def resolve(spec: str) -> Callable:
    module, func = spec.split(":")
    try:
        return getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("draftheads"):
            raise UserError(f"this command is not available in this build ({e.name} is missing)") from None
        raise


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    try:
        if argv[0] in COMMANDS and ("-h" in argv[1:] or "--help" in argv[1:]):
            print(
                command_help(argv[0], [a for a in argv[1:] if a.startswith(tuple(f"{g}=" for g in GROUPS))])
            )
            return 0
        inv = parse(argv)
        if inv.show_cfg:
            print(as_yaml(inv.args), end="")
            return 0
        resolve(COMMANDS[inv.command].entry)(inv.args)
        return 0
    except UserError as e:
        if os.environ.get("DRAFTHEADS_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2 if str(e).startswith("unknown command") else 1
    except KeyboardInterrupt:
        resumable = argv[0] in RESUMABLE
        print(f"error: interrupted{RESUME_NOTE if resumable else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
