"""Every command line the README and docs/ show parses and composes (nothing heavy runs).

Documented examples cannot rot: a renamed key, a removed command or a group option that no
longer exists fails here. ``...`` in an example stands for "more overrides" and is dropped.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bench.lab.study import STUDY as STUDY_ROWS
from draftheads.bench.extension import NO_ROWS
from draftheads.conf.cli import command_help, parse
from draftheads.conf.commands import COMMANDS
from draftheads.conf.schema.flat_keys import flat_draft_key
from draftheads.conf.schema.kinds import DRAFT_KINDS

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```")


def shell_lines(text: str) -> list[str]:
    """Lines of fenced code blocks (continuations joined, comments cut) and inline code spans."""
    out, fenced = [], False
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif fenced:
            out.append(re.split(r"\s#\s", line)[0])
        else:
            out += re.findall(r"`([^`]+)`", line)
    return out


STUDY = "python -m bench.lab.study"  # the maintainers' study: draftheads bench's overrides


def examples(path: Path) -> list[str]:
    """The ``draftheads <command> ...`` invocations shown in ``path``; the study's
    (``python -m bench.lab.study ...``, run from a checkout) as the ``draftheads bench`` they extend."""
    found = []
    for line in shell_lines(path.read_text(encoding="utf-8")):
        line = line.strip().replace(STUDY, "draftheads study")
        m = re.search(r"(?:^|[\s/])(draftheads\s+[a-z-].*)$", line)
        if m and not m.group(1).startswith("draftheads <command>"):
            found.append(m.group(1).strip())
    return found


EXAMPLES = [(p.relative_to(ROOT).as_posix(), e) for p in DOCS for e in examples(p)]


def command_line(example: str) -> tuple[str, ...]:
    """The arguments of ``example`` after ``draftheads`` (``...`` dropped)."""
    return tuple(a for a in shlex.split(example)[1:] if a != "...")


def distinct_examples() -> list[tuple[str, str]]:
    """Each distinct command line once, with every place that shows it (a composition takes a
    tenth of a second, and a third of the examples repeat one shown elsewhere)."""
    places: dict[tuple[str, ...], tuple[list[str], str]] = {}
    for where, example in EXAMPLES:
        places.setdefault(command_line(example), ([], example))[0].append(where)
    return [(", ".join(dict.fromkeys(wheres)), example) for wheres, example in places.values()]


DISTINCT = distinct_examples()


def test_the_docs_show_every_command():
    shown = {shlex.split(e)[1] for _, e in EXAMPLES}
    assert set(COMMANDS) <= shown, set(COMMANDS) - shown
    assert "study" in shown  # and the maintainers' study, from a checkout


@pytest.mark.parametrize("where,example", DISTINCT, ids=[f"{w.split(',')[0]}:{e[:60]}" for w, e in DISTINCT])
def test_documented_command_line_parses_and_composes(where, example):
    argv = list(command_line(example))
    if argv[0] in ("--help", "-h"):
        return
    study = argv[0] == "study"
    argv = ["bench", *argv[1:]] if study else argv
    assert argv[0] in COMMANDS, f"{where}: unknown command in {example!r}"
    flat = [a for a in argv if flat_draft_key(a)]
    assert not flat, f"{where}: {flat} in {example!r} is the flat spelling; write draft.<kind>.<key>"
    if "--help" in argv:
        assert command_help(argv[0])
        return
    inv = parse(argv)
    assert isinstance(inv.args, COMMANDS[argv[0]].args)
    if argv[0] == "bench":  # the study's rows are refused by the installed bench, checked by the study
        (STUDY_ROWS if study else NO_ROWS).check(inv.args.bench)


def readme_chain() -> list[str]:
    """The README's chain of commands, each step reading what the one before wrote."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("each step reading what the one before wrote", 1)[1].split("```bash", 1)[1]
    return examples_in(block.split("```", 1)[0])


def examples_in(block: str) -> list[str]:
    """The ``draftheads`` command lines of one fenced block's text."""
    lines = (re.split(r"\s#\s", line)[0].strip() for line in block.splitlines())
    return [line for line in lines if line.startswith("draftheads ")]


def test_the_readme_chain_trains_on_the_features_it_caches():
    steps = [parse(shlex.split(e)[1:]) for e in readme_chain()]
    caches = [s.args.data.features.out_dir for s in steps if s.command == "features"]
    trains = [s.args.train for s in steps if s.command == "train"]
    assert caches, "the chain caches no features"
    for cache in caches:  # a cache no later step reads is wasted minutes
        assert any(t.features == "offline" and t.feature_cache == cache for t in trains), cache


SECTION_KEYS = sorted({key for kind in DRAFT_KINDS.values() for key in kind.keys}, key=len, reverse=True)
FLAT_KEY = re.compile(r"(?<![\w.])draft\.(" + "|".join(SECTION_KEYS) + r")\b")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_docs_write_drafter_keys_in_their_kinds_section(path):
    """``draft.dflash.block_size``, not ``draft.block_size``: the flat spelling appears only where
    a page says it is the flat spelling."""
    lines = path.read_text(encoding="utf-8").splitlines()
    flat = [line for line in lines if FLAT_KEY.search(line) and "flat" not in line]
    assert not flat, flat[:5]


WORK_LABELS = re.compile(r"\bsession \d|\bsessions\b|\bissue \d|\bticket|/work/|shared/reference", re.I)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_docs_speak_of_the_project_only(path):
    """No work-period labels, ticket numbers or paths outside the repository."""
    hits = [line for line in path.read_text(encoding="utf-8").splitlines() if WORK_LABELS.search(line)]
    assert not hits, hits[:5]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_commands_help_example_parses(name):
    """The example ``draftheads --help`` shows for each command composes as typed (its draft group
    and folders are taken from the kinds' records, so a renamed group shows here)."""
    for example in COMMANDS[name].example.split("  |  "):
        argv = list(command_line(example))
        assert argv[0] == name and not [a for a in argv if flat_draft_key(a)], example
        assert isinstance(parse(argv).args, COMMANDS[name].args), example
