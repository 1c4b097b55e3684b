"""Turn sources into a tokenized, loss-masked ``datasets.Dataset``.

``prepare_dataset(cfg, tokenizer, split)`` reads every source of ``cfg`` (``data.path``, or the
components of ``data.mixture``; ``embedded`` counts as its three components), normalises rows
(:mod:`formats`), renders and masks them (:mod:`chat`), truncates to ``data.max_length``,
mixes components by weight, optionally packs, and returns the dataset with a
:class:`PrepareReport`.

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

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DataConfig
from draftheads.data.chat import encode_chats, encode_text
from draftheads.data.embedded import COMPONENTS
from draftheads.data.formats import Example, RowError, detect_format, to_example
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

    def by_source(self) -> dict[str, SourceReport]:
        return {s.name: s for s in self.sources}

    def format(self) -> str:
        """A table of per-source counts, the totals, and the first skip and drop reasons."""
        head = (
            f"{'source':<24} {'format':<9} {'read':>7} {'held out':>8} {'skipped':>7} {'dropped':>7} "
            f"{'truncated':>9} {'kept':>7} {'tokens':>10} {'trained':>10} {'mixed rows':>10}"
        )
        lines = [f"split {self.split}, max_length {self.max_length}", head]
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


def source_specs(cfg: DataConfig) -> list[SourceSpec]:
    """The sources ``cfg`` names: the mixture components, embedded's components, or ``path``."""
    if cfg.mixture:
        specs = []
        for comp in cfg.mixture:
            comp = dict(comp)
            specs.append(
                SourceSpec(
                    name=str(comp.get("name") or comp["path"]),
                    path=str(comp["path"]),
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


def prepare_source(
    spec: SourceSpec, tokenizer, cfg: DataConfig, split: str
) -> tuple[list[dict], SourceReport]:
    """Rows (dicts) of one source and its report."""
    report = SourceReport(spec.name, spec.path, spec.format, weight=spec.weight)
    rows: list[dict] = []
    pending: list[Example] = []

    def flush() -> None:
        for ex, enc in zip(pending, encode_examples(tokenizer, pending)):
            if isinstance(enc, RowError):
                malformed(ex.id, enc)
                continue
            done = finish_row(*enc, cfg.max_length, cfg.min_loss_tokens)
            if isinstance(done, str):
                report.skip(ex.id, done, malformed=False)
                continue
            ids, mask, truncated = done
            report.truncated += truncated
            report.kept += 1
            report.tokens += len(ids)
            report.loss_tokens += sum(mask)
            rows.append({"input_ids": ids, "loss_mask": mask, "source": spec.name, "id": ex.id})
        pending.clear()

    def malformed(row_id: str, err: RowError) -> None:
        if cfg.strict:
            raise UserError(
                f"malformed row {row_id} in {spec.path}: {err}; fix the row or set data.strict=false to skip it"
            )
        report.skip(row_id, str(err), malformed=True)

    for ex in examples(spec, split, report, cfg.strict, cfg.system_prompt):
        if isinstance(ex, tuple):
            malformed(*ex)
            continue
        if not ex.has_answer():
            report.skip(ex.id, "prompt-only row has no answer (run `draftheads distill` to answer it)", False)
            continue
        pending.append(ex)
        if len(pending) >= CHUNK:
            flush()
    flush()
    return rows, report


def mix(parts: list[tuple[list[dict], SourceReport]], seed: int) -> list[dict]:
    """Resample components to their weights' shares of the total row count, then shuffle.

    The total is the number of kept rows over all components. A component asked for more rows
    than it has is repeated (its ``mixed_rows`` exceeds ``kept``); the report shows both.
    """
    total = sum(len(rows) for rows, _ in parts)
    wsum = sum(r.weight for _, r in parts)
    rng = random.Random(seed)
    out: list[dict] = []
    for rows, report in parts:
        n = round(total * report.weight / wsum)
        if not rows:
            report.mixed_rows = 0
            continue
        order = list(range(len(rows)))
        rng.shuffle(order)
        picked = [rows[order[i % len(rows)]] for i in range(n)]
        report.mixed_rows = len(picked)
        out += picked
    rng.shuffle(out)
    return out


def pack(rows: list[dict], max_length: int) -> list[dict]:
    """Concatenate whole rows, in order, into sequences of at most ``max_length`` tokens."""
    packed: list[dict] = []
    cur: dict | None = None
    for r in rows:
        n = len(r["input_ids"])
        if cur is None or len(cur["input_ids"]) + n > max_length:
            cur = {"input_ids": [], "loss_mask": [], "position_ids": [], "sources": []}
            packed.append(cur)
        mask = list(r["loss_mask"])
        if cur["input_ids"]:
            mask[0] = 0  # never predict a document's first token from the previous document
        cur["input_ids"] += r["input_ids"]
        cur["loss_mask"] += mask
        cur["position_ids"] += list(range(n))
        cur["sources"].append(r["source"])
    for p in packed:
        p["source"] = "+".join(sorted(set(p.pop("sources"))))
    return [p for p in packed if sum(p["loss_mask"])]


def to_dataset(rows: list[dict], packed: bool):
    import datasets

    cols = (
        ["input_ids", "loss_mask", "position_ids", "source"]
        if packed
        else ["input_ids", "loss_mask", "source", "id"]
    )
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "loss_mask": datasets.Sequence(datasets.Value("int8")),
            "position_ids": datasets.Sequence(datasets.Value("int32")),
            "source": datasets.Value("string"),
            "id": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict(
        {c: [r[c] for r in rows] for c in cols}, features=datasets.Features({c: features[c] for c in cols})
    )


def prepare_dataset(cfg: DataConfig, tokenizer, split: str = "train"):
    """Tokenized, loss-masked rows of ``cfg``'s sources: ``(datasets.Dataset, PrepareReport)``."""
    check_split(split)
    specs = source_specs(cfg)
    parts = [prepare_source(spec, tokenizer, cfg, split) for spec in specs]
    report = PrepareReport(split=split, max_length=cfg.max_length, sources=[r for _, r in parts])
    rows = mix(parts, cfg.seed) if cfg.mixture else [row for rows, _ in parts for row in rows]
    if cfg.packing:
        rows = pack(rows, cfg.max_length)
        report.packed = True
    if not rows:
        why = "; ".join(
            f"{s.name}: {s.read} read, "
            + (", ".join(f"{n}x {r}" for r, n in s.reasons.most_common(2)) or "none kept")
            for s in report.sources
        )
        raise UserError(
            f"no training rows for split {split} ({why}); check data.path, data.format and data.fields"
        )
    report.rows = len(rows)
    report.tokens = sum(len(r["input_ids"]) for r in rows)
    report.loss_tokens = sum(sum(r["loss_mask"]) for r in rows)
    return to_dataset(rows, cfg.packing), report
