"""How much distilled text changes when decoded and tokenized again (``roundtrip.json``).

Training tokenizes the rendered chat, not the ids the target generated (``answer_ids``), so an
answer whose text tokenizes differently trains on its re-tokenized form. :func:`roundtrip_changes`
counts the rows, answers and tokens where that happens; :func:`write_roundtrip` writes the count
beside the shards at the end of every run and says it on stderr. Rows a server answered without
token ids hold the text re-tokenized already, so their round trip shows nothing; they are
counted apart.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

from draftheads.data.distill.shards import shard_rows

ROUNDTRIP = "roundtrip.json"


def changed_tokens(ids: list[int], again: list[int]) -> int:
    """Generated tokens not kept by the re-tokenization (outside the longest matching blocks)."""
    blocks = difflib.SequenceMatcher(a=ids, b=again, autojunk=False).get_matching_blocks()
    return len(ids) - sum(b.size for b in blocks)


def roundtrip_changes(out: Path, tokenizer) -> dict:
    """How much distilled text changes when decoded and tokenized again: rows, answers and
    tokens whose generated ids (``answer_ids``) differ from ``encode(decode(ids))``, over every
    shard row. (On SmolLM2 about 0.4% of tokens: the target sometimes emits a non-canonical
    split such as ``Ġsm`` + ``ok`` for ``Ġsmok``.)"""
    rows = shard_rows(out)
    answers = [r.get("answer_ids") or [] for r in rows]
    again = [[tokenizer(tokenizer.decode(i, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
              for i in a] for a in answers]  # fmt: skip
    redo = [[x != y for x, y in zip(a, b)] for a, b in zip(answers, again)]
    return {
        "rows": sum(map(bool, answers)),
        "rows_changed": sum(map(any, redo)),
        "answers": sum(map(len, answers)),
        "answers_changed": sum(map(sum, redo)),
        "tokens": sum(len(i) for a in answers for i in a),
        "tokens_changed": sum(changed_tokens(x, y) for a, b in zip(answers, again) for x, y in zip(a, b)),
        # served without token ids: their ids are the text re-tokenized, a round trip the count cannot see
        "rows_retokenized": sum((r.get("gen") or {}).get("answer_ids") == "text" for r in rows),
    }


def write_roundtrip(out: Path, tokenizer) -> dict:
    """Write :func:`roundtrip_changes` to ``roundtrip.json`` and say it on stderr."""
    c = roundtrip_changes(out, tokenizer)
    (out / ROUNDTRIP).write_text(json.dumps(c, indent=1) + "\n")
    n = c["rows_retokenized"]
    unseen = (
        f"; {n} rows hold the server's text re-tokenized, not its generated ids (it sent none)" if n else ""
    )
    print(
        f"distill: {c['rows_changed']} of {c['rows']} rows ({c['tokens_changed']} of {c['tokens']} tokens) "
        f"tokenize differently once decoded{unseen}",
        file=sys.stderr,
    )
    return c
