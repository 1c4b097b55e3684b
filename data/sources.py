"""Reading raw rows: the embedded set, local files and Hugging Face datasets.

A folder of ``*.jsonl`` files (for example a ``draftheads distill`` output, whose shards only
are read) is read file by file. A source yields ``(row_id, row)`` pairs where ``row`` is a dict, or a :class:`RowError` for a
line that could not even be parsed. JSON Lines files are read line by line with the standard
``json`` module so that one bad line (invalid JSON, bad UTF-8) is a counted, skipped row rather
than a failed load; every other format (json arrays, parquet, arrow, dataset folders, hub ids)
goes through ``datasets``.

Held-out rows of user data are chosen by a hash of the row's content
(``data.heldout_fraction``), so duplicates land on the same side and the split is stable
under reordering.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.conf.schema.checks import is_hub_id
from draftheads.data.embedded import COMPONENTS, embedded_items
from draftheads.data.formats import RowError

LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
SPLITS = ("train", "heldout")


@dataclass
class SourceSpec:
    """One source of rows: a path, how to read it, and its weight in a mixture."""

    name: str
    path: str
    format: str = "auto"
    fields: dict[str, str] = field(default_factory=dict)
    split: str = "train"
    max_rows: int | None = None
    weight: float | None = None
    heldout_fraction: float = 0.0

    @property
    def key(self) -> str:
        """How the user names this source's path: ``data.path``, or its mixture component's."""
        return "data.path" if self.weight is None else f"data.mixture[{self.name}].path"

    @property
    def embedded(self) -> bool:
        return self.path == "embedded" or self.path.startswith("embedded:")


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise UserError(f"split={split!r} is not a data split; use train or heldout")
    return split


def content_heldout(row: dict, fraction: float) -> bool:
    """Whether a user row is held out: a hash of its content below ``fraction``."""
    if fraction <= 0:
        return False
    key = json.dumps(row, sort_keys=True, ensure_ascii=True, default=str).encode()
    return int(hashlib.sha256(key).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction


def read_jsonl(path: Path) -> Iterator[tuple[str, dict | RowError]]:
    """Rows of a JSON Lines file; a line that is not valid UTF-8 JSON object is a RowError. A
    byte-order mark that starts the file is dropped, as a text editor does (``utf-8-sig``)."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            rid = f"{path.name}:{i + 1}"
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8-sig" if i == 0 else "utf-8"))
            except UnicodeDecodeError:
                yield rid, RowError("bad encoding (not UTF-8)")
                continue
            except json.JSONDecodeError as e:
                yield rid, RowError(f"invalid JSON ({e.msg})")
                continue
            yield rid, row if isinstance(row, dict) else RowError("row is not an object")


def read_with_datasets(path: str, split: str) -> Iterator[tuple[str, dict]]:
    """Rows of a local json/parquet/arrow file or folder, or of a hub dataset, via ``datasets``."""
    import datasets

    p = Path(path).expanduser()
    try:
        if p.is_file():
            ds = datasets.load_dataset(LOCAL_SUFFIXES[p.suffix], data_files=str(p), split="train")
        else:
            ds = datasets.load_dataset(str(p) if p.is_dir() else path, split=split)
    except UserError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise UserError(
            f"cannot load data.path={path} ({first}); give a local json/jsonl/parquet/arrow file "
            "or folder, or a reachable Hugging Face dataset id"
        ) from None
    name = p.name if p.exists() else path
    for i, row in enumerate(ds):
        yield f"{name}:{i}", row


def is_empty_file(path: Path) -> bool:
    """A file with nothing but whitespace, or an empty JSON array or object, in it."""
    if path.stat().st_size > 64:
        return False
    return path.read_bytes().strip() in (b"", b"[]", b"{}")


def jsonl_files(directory: Path) -> list[Path]:
    """The JSON Lines files of a folder: a distillation's shards only, else every ``*.jsonl``."""
    if (directory / "distill.json").is_file():
        return sorted(directory.glob("shard-*.jsonl"))
    return sorted(directory.glob("*.jsonl"))


def raw_rows(spec: SourceSpec) -> Iterator[tuple[str, dict | RowError]]:
    """The raw rows of a non-embedded source, in file order."""
    p = Path(spec.path).expanduser()
    if p.is_file():
        if is_empty_file(p):
            raise UserError(f"{spec.key}={spec.path} is empty; give a file with at least one row")
        if p.suffix not in LOCAL_SUFFIXES:
            raise UserError(
                f"{spec.key}={spec.path}: unsupported file type {p.suffix!r}; use .jsonl, .json, .parquet or .arrow"
            )
        return read_jsonl(p) if p.suffix == ".jsonl" else read_with_datasets(str(p), spec.split)
    if p.is_dir():
        files = jsonl_files(p)
        return (
            (row for f in files for row in read_jsonl(f)) if files else read_with_datasets(str(p), spec.split)
        )
    if spec.path.startswith((".", "/", "~")) or p.suffix in LOCAL_SUFFIXES:
        raise UserError(f"{spec.key}={spec.path} does not exist; check the path")
    if not is_hub_id(spec.path):
        near = difflib.get_close_matches(spec.path, ["embedded", *(f"embedded:{c}" for c in COMPONENTS)], n=1)
        raise UserError(
            f"{spec.key}={spec.path} is not a file or folder here, nor a dataset id ORG/NAME"
            + (f"; did you mean {spec.key}={near[0]}?" if near else "; check the path")
        )
    return read_with_datasets(spec.path, spec.split)


def embedded_component(path: str) -> str:
    component = path.split(":", 1)[1] if ":" in path else "all"
    if component != "all" and component not in COMPONENTS:
        raise UserError(f"data.path={path} is unknown; use embedded or embedded:{'|'.join(COMPONENTS)}")
    return component


def embedded_rows(spec: SourceSpec, split: str) -> Iterator[tuple[str, dict]]:
    """Embedded items of one side of the fixed split, as OpenAI-messages rows."""
    for item in embedded_items(embedded_component(spec.path), split):
        yield item.id, {"id": item.id, "category": item.component, "messages": item.messages()}
