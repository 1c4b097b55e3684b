"""``copy``: long prompts whose answers copy from them, built from what every machine has.

Summaries, answers grounded in a retrieved document and code edits read a prompt of a thousand
tokens or more and then repeat much of it: this is where prompt lookup shines, and where a
drafter that ignores the prompt falls behind. Each prompt wraps 4,000-7,200 characters (about
1,000-2,000 tokens) of the running interpreter's own text, in one of four tasks (the category):

* ``summarise``: summarise a section of Python's reference (``pydoc_data``'s topic texts);
* ``quote``: answer from such a section by quoting its sentences word for word;
* ``rename``: rename one function in a standard-library module's source, returning all of it;
* ``annotate``: add type hints to the same kind of source, returning all of it.

Nothing is downloaded; the text follows the Python version, which every report records.
"""

from __future__ import annotations

import re

from draftheads.conf.errors import UserError
from draftheads.data.long_prompts import head, module_source

TOPICS = (
    "compound",
    "types",
    "formatstrings",
    "typesseq",
    "assignment",
    "comparisons",
    "execmodel",
    "import",
)
MODULES = ("glob", "queue", "zipapp", "operator", "linecache", "numbers", "copy", "netrc")
CHARS = (4000, 4800, 5600, 6400, 7200)  # per prompt, in turn
TASKS = {
    "summarise": (
        "Summarise this section of the Python language reference in a few paragraphs, keeping its own "
        "terms.\n\n{text}"
    ),
    "quote": (
        "Here is a section of the Python language reference.\n\n{text}\n\nUsing only this section, "
        "answer: what does it say about {subject}? Quote the relevant sentences word for word."
    ),
    "rename": (
        "Rename the function `{name}` to `{name}_v2` everywhere in this code (its definition and every "
        "call) and return the whole updated code, otherwise unchanged.\n\n```python\n{text}\n```"
    ),
    "annotate": (
        "Add type hints to every function signature in this code and return the whole code, otherwise "
        "unchanged.\n\n```python\n{text}\n```"
    ),
}


def topic_text(name: str) -> str:
    """The text of one topic of Python's reference, as ``help()`` shows it."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        topics = {}
    if name not in topics:
        raise UserError(
            f"the copy prompt set reads the reference topic {name!r} of Python's pydoc_data, which this "
            "interpreter lacks; use a CPython with its standard library (not a stripped install)"
        )
    return topics[name]


def first_function(source: str) -> str:
    """The name of the first top-level function a source defines (the one ``rename`` renames)."""
    found = re.search(r"^def ([A-Za-z_]\w*)\(", source, re.MULTILINE)
    return found.group(1) if found else "main"


def copy_items() -> list[tuple[str, str, str]]:
    """``(id, category, prompt)``: each topic asked to be summarised or quoted and each module to be
    renamed in or annotated, in turn, at the sizes taken in turn (a fixed order)."""
    out = []
    for i, topic in enumerate(TOPICS):
        task = ("summarise", "quote")[i % 2]
        text = head(topic_text(topic), CHARS[i % len(CHARS)])
        subject = next(line for line in text.splitlines() if line.strip()).strip().lower()  # its title
        out.append((f"copy/{topic}", task, TASKS[task].format(text=text, subject=subject)))
    for i, name in enumerate(MODULES):
        task = ("rename", "annotate")[i % 2]
        text = head(module_source(name), CHARS[(i + 2) % len(CHARS)])
        out.append((f"copy/{name}", task, TASKS[task].format(text=text, name=first_function(text))))
    return out
