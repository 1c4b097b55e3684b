"""Row formats: detect a dataset's format and normalise each row to chat messages or text.

Every supported format becomes one :class:`Example`:

* ``sharegpt``  ``conversations: [{from, value}]``            -> chat
* ``messages``  ``messages: [{role, content}]`` (OpenAI)      -> chat
* ``alpaca``    ``instruction``, ``input``, ``output``        -> chat (one user turn, one answer)
* ``prompt``    ``prompt: str`` or Spec-Bench ``turns: [str]`` -> chat with user turns only
* ``text``      ``text: str``                                 -> plain text, every token trained

Field names are canonical names; ``data.fields`` maps them to a dataset's own column names.
A malformed row raises :class:`RowError` with a short reason, which the pipeline counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import FORMATS
from draftheads.conf.schema.data import check_format as schema_check_format

# ShareGPT speaker names seen in the wild, mapped to chat-template roles.
ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


class RowError(ValueError):
    """A malformed row: the message is the reason shown in the skip report."""


@dataclass
class Example:
    """One normalised row: chat ``messages`` (``role``/``content``), or plain ``text``."""

    id: str
    messages: list[dict[str, str]] = field(default_factory=list)
    text: str | None = None
    category: str = ""

    @property
    def is_text(self) -> bool:
        return self.text is not None

    def user_turns(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "user"]

    def has_answer(self) -> bool:
        return self.is_text or any(m["role"] == "assistant" for m in self.messages)


def detect_format(columns: Iterable[str], fields: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The format implied by a dataset's columns, and the field map to read it with."""
    cols = set(columns)
    f = dict(fields)

    def has(name: str) -> bool:
        return f.get(name, name) in cols

    if has("conversations"):
        return "sharegpt", f
    if has("messages"):
        return "messages", f
    if has("instruction") and has("output"):
        return "alpaca", f
    if "question" in cols and "answer" in cols and not has("prompt"):
        return "alpaca", {"instruction": "question", "output": "answer", **f}
    if has("prompt") or has("turns"):
        return "prompt", f
    if has("text"):
        return "text", f
    raise UserError(
        f"cannot detect the data format from columns {sorted(cols)}; set data.format="
        f"{'|'.join(FORMATS)} and map columns with data.fields (e.g. data.fields.text=body)"
    )


def check_format(fmt: str, key: str = "data.format") -> str:
    """``fmt`` itself, when it is ``auto`` or a known format."""
    schema_check_format(key, fmt)
    return fmt


def _text(value, what: str) -> str:
    """A non-empty, encodable string, or a RowError naming ``what``."""
    if value is None:
        raise RowError(f"missing {what}")
    if not isinstance(value, str):
        raise RowError(f"{what} is {type(value).__name__}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RowError(f"bad encoding in {what} (unpaired surrogate)") from None
    if not value.strip():
        raise RowError(f"empty {what}")
    return value


def _get(row: dict, fields: dict[str, str], name: str):
    return row.get(fields.get(name, name))


def _field(fields: dict[str, str], name: str) -> str:
    """``name`` as a skip reason shows it: with the dataset's column when ``data.fields`` maps it."""
    column = fields.get(name, name)
    return name if column == name else f"{name} (column {column!r})"


def _turns(value, what: str, role_key: str, content_key: str, aliases: bool) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RowError(f"{what} is not a non-empty list")
    out = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise RowError(f"{what}[{i}] is not an object")
        role = turn.get(role_key)
        if not isinstance(role, str):
            raise RowError(f"{what}[{i}] has no {role_key}")
        canon = ROLE_ALIASES.get(role.lower()) if aliases else role
        if canon not in ("system", "user", "assistant"):
            raise RowError(f"{what}[{i}] has unknown role {role!r}")
        out.append({"role": canon, "content": _text(turn.get(content_key), f"{what}[{i}].{content_key}")})
        if turn.get("unfinished") is True:  # a cut-off answer: no end-of-turn label (data/chat.py)
            out[-1]["unfinished"] = True
    return out


def to_example(
    row: dict, fmt: str, fields: dict[str, str], row_id: str, system: str | None = None
) -> Example:
    """Normalise one raw row of format ``fmt``; raises :class:`RowError` when it is malformed."""
    if not isinstance(row, dict):
        raise RowError("row is not an object")
    category = _get(row, fields, "category")
    category = category if isinstance(category, str) else ""
    rid = next((row.get(k) for k in (fields.get("id", "id"), "question_id", "task_id") if k in row), None)
    rid = str(rid) if rid is not None and not isinstance(rid, (dict, list)) else row_id
    if fmt == "text":
        return Example(rid, text=_text(_get(row, fields, "text"), _field(fields, "text")), category=category)
    if fmt == "sharegpt":
        msgs = _turns(
            _get(row, fields, "conversations"),
            "conversations",
            fields.get("from", "from"),
            fields.get("value", "value"),
            aliases=True,
        )
    elif fmt == "messages":
        msgs = _turns(
            _get(row, fields, "messages"),
            "messages",
            fields.get("role", "role"),
            fields.get("content", "content"),
            aliases=False,
        )
    elif fmt == "alpaca":
        instruction = _text(_get(row, fields, "instruction"), _field(fields, "instruction"))
        extra = _get(row, fields, "input")
        if extra is not None and not isinstance(extra, str):
            raise RowError(f"input is {type(extra).__name__}, not a string")
        user = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
        msgs = [{"role": "user", "content": user}]
        output = _get(row, fields, "output")
        if output is not None:
            msgs.append({"role": "assistant", "content": _text(output, _field(fields, "output"))})
    elif fmt == "prompt":
        turns = _get(row, fields, "turns")
        if turns is None:
            turns = [_get(row, fields, "prompt")]
        if not isinstance(turns, list) or not turns:
            raise RowError("turns is not a non-empty list")
        msgs = [{"role": "user", "content": _text(t, f"turns[{i}]")} for i, t in enumerate(turns)]
    else:
        raise UserError(f"data.format={fmt} is unknown; use one of {', '.join(FORMATS)}")
    sys_text = _get(row, fields, "system")
    if isinstance(sys_text, str) and sys_text.strip() and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": sys_text})
    elif system and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": system})
    if all(m["role"] == "system" for m in msgs):
        raise RowError("no user or assistant turn")
    return Example(rid, messages=msgs, category=category)
