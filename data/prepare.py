"""Turn sources into a tokenized, loss-masked ``datasets.Dataset``.

``prepare_dataset(cfg, tokenizer, split)`` reads every source of ``cfg`` (``data.path``, or the
components of ``data.mixture``; ``embedded`` counts as its three components), normalises rows
(:mod:`formats`), renders and masks them (:mod:`chat`), truncates to ``data.max_length``,
mixes components by weight, optionally packs, and returns the dataset with a
:class:`PrepareReport`.

Rows are read and normalised in Python (each malformed row is counted with its reason), and
from there flow as ``datasets.Dataset``: tokenizing is a batched ``map``, rows that cannot
train are removed with ``filter``, a mixture is ``select`` over the concatenated components
(exact per-component counts, unlike sampling with ``interleave_datasets``), and packing is one
batched ``map``. The datasets are in memory, so no cache files are written.

Columns: ``input_ids`` and ``loss_mask`` (``loss_mask[t] = 1``: token ``t`` is an assistant token
the drafter learns to predict), ``source`` (component name) and, unless packed, ``id``. Packed
rows add ``position_ids`` restarting at 0 at each document, and never train a document's first
token (it would be predicted from the previous document).

Row accounting, per source: ``read`` rows on this side of the split; ``skipped`` malformed rows
(with the first reasons; ``data.strict=true`` raises instead); ``dropped`` well-formed rows that
cannot train (no answer, too few trained tokens within ``max_length``); ``truncated`` rows cut
to ``max_length`` and kept. An empty result raises :class:`UserError`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DataConfig
from draftheads.data.chat import encode_chats, encode_text
from draftheads.data.embedded import COMPONENTS
from draftheads.data.formats import Example, RowError, detect_format, to_example
from draftheads.data.packing import mix, pack_batch
from draftheads.data.sources import SourceSpec, check_split, content_heldout, embedded_rows, raw_rows

CHUNK = 512
MAX_REASONS = 5


@dataclass
class SourceReport:
    """What happened to one source's rows."""

    name: str
    path: str
    format: str = "auto"
    read: int = 0
    heldout: int = 0
    kept: int = 0
    skipped: int = 0
    dropped: int = 0
    truncated: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    weight: float | None = None
    mixed_rows: int | None = None
    reasons: Counter = field(default_factory=Counter)
    first_skips: list[str] = field(default_factory=list)

    def skip(self, row_id: str, reason: str, malformed: bool) -> None:
        if malformed:
            self.skipped += 1
            if len(self.first_skips) < MAX_REASONS:
                self.first_skips.append(f"{row_id}: {reason}")
        else:
            self.dropped += 1
        self.reasons[reason] += 1


@dataclass
class PrepareReport:
    """Per-source counts plus the totals of the final dataset."""

    split: str
    max_length: int
    sources: list[SourceReport] = field(default_factory=list)
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    packed: bool = False
    missing: list[str] = field(default_factory=list)

    def by_source(self) -> dict[str, SourceReport]:
        return {s.name: s for s in self.sources}

    def format(self) -> str:
        """A table of per-source counts, the totals, and the first skip and drop reasons."""
        head = (
            f"{'source':<24} {'format':<9} {'read':>7} {'held out':>8} {'skipped':>7} {'dropped':>7} "
            f"{'truncated':>9} {'kept':>7} {'tokens':>10} {'trained':>10} {'mixed rows':>10}"
        )
        lines = [f"split {self.split}, max_length {self.max_length}"]
        lines += [f"left out optional component {m}" for m in self.missing]
        lines.append(head)
        for s in self.sources:
            mixed = "" if s.mixed_rows is None else f"{s.mixed_rows} (w {s.weight:g})"
            lines.append(
                f"{s.name[-24:]:<24} {s.format:<9} {s.read:>7} {s.heldout:>8} {s.skipped:>7} {s.dropped:>7} "
                f"{s.truncated:>9} {s.kept:>7} {s.tokens:>10} {s.loss_tokens:>10} {mixed:>10}"
            )
        kind = "packed rows" if self.packed else "rows"
        lines.append(
            f"total: {self.rows} {kind}, {self.tokens} tokens, {self.loss_tokens} trained tokens "
            f"({self.loss_tokens / max(self.tokens, 1):.0%})"
        )
        for s in self.sources:
            if s.reasons:
                why = "; ".join(f"{n}x {r}" for r, n in s.reasons.most_common(MAX_REASONS))
                lines.append(f"{s.name}: skipped/dropped: {why}")
            lines += [f"  first skipped row {r}" for r in s.first_skips]
        return "\n".join(lines)


def component_path(comp: dict, data_dir: str) -> str:
    """A mixture component's path; ``in_data_dir: true`` puts it inside ``data.data_dir``."""
    return str(Path(data_dir) / str(comp["path"])) if comp.get("in_data_dir") else str(comp["path"])


def absent(comp: dict, data_dir: str) -> bool:
    """An ``optional: true`` mixture component whose local path does not exist."""
    path = component_path(comp, data_dir)
    return (
        bool(comp.get("optional"))
        and not path.startswith("embedded")
        and not Path(path).expanduser().exists()
    )


def missing_components(cfg: DataConfig) -> list[str]:
    """``"name (path absent)"`` for every optional mixture component that is left out."""
    return [
        f"{c.get('name') or c['path']} ({component_path(c, cfg.data_dir)} absent)"
        for c in map(dict, cfg.mixture)
        if absent(c, cfg.data_dir)
    ]


def source_specs(cfg: DataConfig) -> list[SourceSpec]:
    """The sources ``cfg`` names: the mixture components (less absent optional ones), embedded's
    components, or ``path``."""
    if cfg.mixture:
        specs = []
        for comp in cfg.mixture:
            comp = dict(comp)
            if absent(comp, cfg.data_dir):
                continue
            specs.append(
                SourceSpec(
                    name=str(comp.get("name") or comp["path"]),
                    path=component_path(comp, cfg.data_dir),
                    format=str(comp.get("format", cfg.format)),
                    fields=dict(comp.get("fields") or cfg.fields),
                    split=str(comp.get("split", cfg.split)),
                    max_rows=comp.get("max_rows", cfg.max_rows),
                    weight=float(comp.get("weight", 1.0)),
                    heldout_fraction=float(comp.get("heldout_fraction", cfg.heldout_fraction)),
                )
            )
        return specs
    if cfg.path == "embedded":
        return [
            SourceSpec(f"embedded:{c}", f"embedded:{c}", max_rows=cfg.max_rows, fields=dict(cfg.fields))
            for c in COMPONENTS
        ]
    return [
        SourceSpec(
            name=cfg.path,
            path=cfg.path,
            format=cfg.format,
            fields=dict(cfg.fields),
            split=cfg.split,
            max_rows=cfg.max_rows,
            heldout_fraction=cfg.heldout_fraction,
        )
    ]


def examples(
    spec: SourceSpec, split: str, report: SourceReport, strict: bool, system: str | None
) -> Iterator[Example | tuple[str, RowError]]:
    """Normalised examples of one side of the split, or ``(row_id, error)`` for malformed rows."""
    if spec.embedded:
        rows = embedded_rows(spec, split)
    else:
        if split == "heldout" and spec.heldout_fraction <= 0:
            raise UserError(
                f"split=heldout needs held-out rows from {spec.path}; set data.heldout_fraction (e.g. 0.05)"
            )
        rows = raw_rows(spec)
    fmt, fields = (spec.format, spec.fields) if spec.format != "auto" else (None, spec.fields)
    for row_id, row in rows:
        if spec.max_rows is not None and report.read >= spec.max_rows:
            break
        if not spec.embedded and not isinstance(row, RowError):
            if content_heldout(row, spec.heldout_fraction) != (split == "heldout"):
                report.heldout += split == "train"
                continue
        report.read += 1
        if isinstance(row, RowError):
            yield row_id, row
            continue
        if fmt is None:
            fmt, fields = detect_format(row.keys(), spec.fields)
            report.format = fmt
        try:
            yield to_example(row, fmt, fields, row_id, system)
        except RowError as e:
            yield row_id, e
    if spec.format != "auto":
        report.format = spec.format
    if spec.embedded:
        report.format = "messages"


def encode_examples(tokenizer, batch: list[Example]) -> list[tuple[list[int], list[int]] | RowError]:
    """Token ids and loss masks of chat and text examples, in order."""
    chats = [i for i, ex in enumerate(batch) if not ex.is_text]
    texts = [i for i, ex in enumerate(batch) if ex.is_text]
    out: list = [None] * len(batch)
    for i, enc in zip(chats, encode_chats(tokenizer, [batch[i].messages for i in chats])):
        out[i] = enc
    for i, enc in zip(texts, encode_text(tokenizer, [batch[i].text for i in texts])):
        out[i] = enc
    return out


def finish_row(
    ids: list[int], mask: list[int], max_length: int, min_loss: int
) -> tuple[list[int], list[int], bool] | str:
    """Truncate to ``max_length``; a reason string when too few trained tokens remain."""
    truncated = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    n = sum(mask)
    if n < max(min_loss, 1):
        where = " within max_length" if truncated else ""
        return f"fewer than {max(min_loss, 1)} trained tokens{where}"
    return ids, mask, truncated


NO_ANSWER = "prompt-only row has no answer (run `draftheads distill` to answer it)"


def example_features():
    """Arrow types of normalised examples: chat ``messages`` (as JSON, so that every key a turn
    carries, such as ``unfinished``, comes back exactly) or plain ``text`` per row."""
    import datasets

    return datasets.Features(
        {
            "id": datasets.Value("string"),
            "messages": datasets.Value("string"),
            "text": datasets.Value("string"),
        }
    )


def row_features(packed: bool):
    """Arrow types of the prepared dataset's columns."""
    import datasets

    ints = {
        "input_ids": datasets.List(datasets.Value("int32")),
        "loss_mask": datasets.List(datasets.Value("int8")),
    }
    if packed:
        return datasets.Features(
            {
                **ints,
                "position_ids": datasets.List(datasets.Value("int32")),
                "source": datasets.Value("string"),
            }
        )
    return datasets.Features({**ints, "source": datasets.Value("string"), "id": datasets.Value("string")})


def normalised(spec: SourceSpec, split: str, report: SourceReport, cfg: DataConfig):
    """One source's trainable examples as a ``datasets.Dataset``; malformed and prompt-only rows counted."""
    import datasets

    records = []
    for ex in examples(spec, split, report, cfg.strict, cfg.system_prompt):
        if isinstance(ex, tuple):
            malformed(report, spec, cfg.strict, *ex)
        elif not ex.has_answer():
            report.skip(ex.id, NO_ANSWER, malformed=False)
        else:
            records.append({"id": ex.id, "messages": json.dumps(ex.messages), "text": ex.text})
    features = example_features()
    return datasets.Dataset.from_dict({c: [r[c] for r in records] for c in features}, features=features)


def malformed(report: SourceReport, spec: SourceSpec, strict: bool, row_id: str, err: RowError | str) -> None:
    """Count a malformed row, or raise on it under ``data.strict=true``."""
    if strict:
        raise UserError(
            f"malformed row {row_id} in {spec.path}: {err}; fix the row or set data.strict=false to skip it"
        )
    report.skip(row_id, str(err), malformed=True)


def encode_batch(batch: dict, tokenizer, max_length: int, min_loss: int) -> dict:
    """``datasets.map`` function: token ids and loss masks, or the reason a row cannot train."""
    exs = [Example(i, json.loads(m), t) for i, m, t in zip(batch["id"], batch["messages"], batch["text"])]
    out: dict[str, list] = {"input_ids": [], "loss_mask": [], "truncated": [], "reason": [], "malformed": []}
    for enc in encode_examples(tokenizer, exs):
        ids, mask, truncated, reason = [], [], False, ""
        if isinstance(enc, RowError):
            reason = str(enc)
        else:
            done = finish_row(*enc, max_length, min_loss)
            if isinstance(done, str):
                reason = done
            else:
                ids, mask, truncated = done
        out["input_ids"].append(ids)
        out["loss_mask"].append(mask)
        out["truncated"].append(truncated)
        out["reason"].append(reason)
        out["malformed"].append(isinstance(enc, RowError))
    return out


def prepare_source(spec: SourceSpec, tokenizer, cfg: DataConfig, split: str):
    """One source's tokenized rows (``datasets.Dataset``) and its report."""
    import datasets

    report = SourceReport(spec.name, spec.path, spec.format, weight=spec.weight)
    ds = normalised(spec, split, report, cfg)
    if not len(ds):
        features = row_features(packed=False)
        return datasets.Dataset.from_dict({c: [] for c in features}, features=features), report
    ds = ds.map(
        encode_batch,
        batched=True,
        batch_size=CHUNK,
        fn_kwargs={"tokenizer": tokenizer, "max_length": cfg.max_length, "min_loss": cfg.min_loss_tokens},
        remove_columns=["messages", "text"],
        desc=f"tokenize {spec.name}",
    )
    for row_id, reason, bad in zip(ds["id"], ds["reason"], ds["malformed"]):
        if bad:
            malformed(report, spec, cfg.strict, row_id, reason)
        elif reason:
            report.skip(row_id, reason, malformed=False)
    ds = ds.filter(lambda reason: not reason, input_columns="reason")
    report.kept = len(ds)
    report.truncated = sum(ds["truncated"])
    report.tokens = sum(len(ids) for ids in ds["input_ids"])
    report.loss_tokens = sum(sum(m) for m in ds["loss_mask"])
    ds = ds.select_columns(["input_ids", "loss_mask", "id"]).add_column("source", [spec.name] * len(ds))
    return ds.cast(row_features(packed=False)), report


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """Silence ``datasets``' per-step progress bars (the report is the output), then restore them."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def prepare_dataset(cfg: DataConfig, tokenizer, split: str = "train"):
    """Tokenized, loss-masked rows of ``cfg``'s sources: ``(datasets.Dataset, PrepareReport)``."""
    check_split(split)
    with no_progress_bars():
        return build(cfg, tokenizer, split)


def build(cfg: DataConfig, tokenizer, split: str):
    """:func:`prepare_dataset`'s work: every source through ``datasets``, mixed, maybe packed."""
    import datasets

    specs = source_specs(cfg)
    parts = [prepare_source(spec, tokenizer, cfg, split) for spec in specs]
    report = PrepareReport(
        split=split, max_length=cfg.max_length, sources=[r for _, r in parts], missing=missing_components(cfg)
    )
    if cfg.mixture:
        ds = mix(parts, cfg.seed)
    else:
        ds = datasets.concatenate_datasets([d for d, _ in parts])
    if cfg.packing:
        ds = ds.map(
            pack_batch,
            batched=True,
            batch_size=None,
            fn_kwargs={"max_length": cfg.max_length},
            remove_columns=ds.column_names,
            features=row_features(packed=True),
            desc="pack",
        )
        report.packed = True
    if not len(ds):
        why = "; ".join(
            f"{s.name}: {s.read} read, "
            + (", ".join(f"{n}x {r}" for r, n in s.reasons.most_common(2)) or "none kept")
            for s in report.sources
        )
        raise UserError(
            f"no training rows for split {split} ({why}); check data.path, data.format and data.fields"
        )
    report.rows = len(ds)
    report.tokens = sum(len(ids) for ids in ds["input_ids"])
    report.loss_tokens = sum(sum(m) for m in ds["loss_mask"])
    return ds, report
