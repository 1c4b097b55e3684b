"""A distillation's output folder: its manifest, its JSONL shards, and how a rerun resumes them.

Output directory::

    distill.json           target fingerprint, generation parameters, prompt source, batch size
    prompts.jsonl          (self-prompt source only) the target-written, deduplicated prompts
    prompts.stats.json     their diversity: distinct n-grams, length spread, duplicates removed
    shard-00000.jsonl      one chat per line, OpenAI-messages format (``draftheads data`` reads it)
    roundtrip.json         how much the answers change once decoded and tokenized again

Each output row is ``{"id", "category", "messages", "gen", "finish", "answer_ids"}``; ``answer_ids``
holds the token ids the target generated for each assistant turn (before any decode). ``gen``
repeats the generation parameters and the target's name and tokenizer hash, so a row is
self-describing. ``roundtrip.json`` is :mod:`draftheads.data.distill.roundtrip`'s.

Rows are appended batch by batch and flushed to disk (:func:`append_rows`). A rerun repairs a
torn last line and learns the ids already written (:func:`repair_shards`), so only what is
missing is generated again; a rerun with other settings is refused (:func:`write_manifest`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from draftheads.conf.errors import UserError

MANIFEST = "distill.json"
PROMPTS = "prompts.jsonl"


def write_manifest(out: Path, manifest: dict) -> None:
    """Write ``distill.json``, or refuse when ``out`` holds a run with other settings."""
    path = out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        if old != manifest:
            diff = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
            raise UserError(
                f"{out} holds a distillation with other settings ({', '.join(diff)}); "
                "use another data.distill.out_dir or the same settings to resume"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1))


def repair_shards(out: Path) -> set[str]:
    """Drop a torn last line from each shard; return the ids already written."""
    done: set[str] = set()
    for shard in sorted(out.glob("shard-*.jsonl")):
        data = shard.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            shard.write_bytes(data)
        for n, line in enumerate(data.splitlines()):
            try:
                done.add(json.loads(line)["id"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError(
                    f"{shard}:{n + 1} is corrupt; delete that line (or the shard) and rerun to regenerate it"
                ) from None
    return done


def shard_path(out: Path, batch: int, batch_size: int, rows_per_shard: int) -> Path:
    """The shard that batch ``batch`` (of ``batch_size`` prompts) is written to, about
    ``rows_per_shard`` rows a shard."""
    return out / f"shard-{batch * batch_size // rows_per_shard:05d}.jsonl"


def append_rows(shard: Path, rows: list[dict], done: set[str], gen: dict) -> int:
    """Append the rows whose id is not in ``done`` to ``shard``, each with ``gen``, and flush them
    to disk; return how many were written."""
    written = 0
    with open(shard, "a", encoding="utf-8") as f:
        for row in rows:
            if row["id"] not in done:
                f.write(json.dumps({**row, "gen": gen}, ensure_ascii=False) + "\n")
                written += 1
        f.flush()
        os.fsync(f.fileno())
    return written


def shard_rows(out: Path) -> list[dict]:
    """Every row of a distillation's shards, in shard order."""
    return [
        json.loads(line) for f in sorted(Path(out).glob("shard-*.jsonl")) for line in f.open(encoding="utf-8")
    ]
