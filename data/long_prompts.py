"""``long``: long-context prompts of about 1-2k tokens, built from what every machine has.

Long-context work (summaries, answers grounded in a retrieved document) reads a prompt of a
thousand tokens or more before it answers, so the verify forward runs after a long cached
context and prompt lookup has much to copy from. The set asks about the source of pure-Python
modules of the running interpreter's standard library: "summarise this module" and "explain its
first functions", each over the start of one module's source cut at a line boundary, at sizes
from about 4,000 to 7,200 characters (about 1,000-2,000 tokens of code). It needs no download;
its text follows the Python version, which every report records.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from draftheads.conf.errors import UserError

# pure-Python modules of every CPython 3.10+ (no C accelerator needed to read their source)
MODULES = (
    "textwrap",
    "shlex",
    "fnmatch",
    "heapq",
    "bisect",
    "calendar",
    "difflib",
    "fractions",
    "statistics",
    "contextlib",
    "dataclasses",
    "ipaddress",
    "pprint",
    "string",
    "sched",
    "graphlib",
)
CHARS = (4000, 4800, 5600, 6400, 7200)  # per prompt, in turn: about 1,000-2,000 tokens of code
TASKS = {
    "summarise": (
        "Summarise what this part of Python's `{name}` module does: its purpose, its main functions "
        "and classes, and how they fit together.\n\n```python\n{source}\n```"
    ),
    "explain": (
        "Here is the start of the source of Python's `{name}` module.\n\n```python\n{source}\n```\n\n"
        "Using only this code, explain what its first two public functions or classes do, which "
        "arguments they take and what they return."
    ),
}


def module_source(name: str) -> str:
    """The source text of the standard library module ``name`` (read, never imported)."""
    spec = importlib.util.find_spec(name)
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py") or not Path(origin).is_file():
        raise UserError(
            f"the long prompt set reads the source of Python's {name} module, which this interpreter "
            "lacks; use a CPython with its standard library source (not a stripped install)"
        )
    return Path(origin).read_text(encoding="utf-8")


def head(text: str, chars: int) -> str:
    """The first whole lines of ``text`` that fit in ``chars`` characters."""
    if len(text) <= chars:
        return text
    cut = text.rfind("\n", 0, chars)
    return text[: cut if cut > 0 else chars]


def long_items() -> list[tuple[str, str, str]]:
    """``(id, category, prompt)`` per module, the tasks and sizes taken in turn (a fixed order)."""
    tasks = list(TASKS)
    out = []
    for i, name in enumerate(MODULES):
        task = tasks[i % len(tasks)]
        source = head(module_source(name), CHARS[i % len(CHARS)])
        out.append((f"long/{name}", task, TASKS[task].format(name=name, source=source)))
    return out
