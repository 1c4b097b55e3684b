"""Evaluation and generation prompts: ``load_prompts(source) -> list[PromptRow]``.

Sources:

* ``heldout``: the user turns of the embedded held-out split (never trained on);
* ``humaneval``: the 164 HumanEval problems, phrased as the embedded set phrases them;
* ``long``: long-context prompts (about 1-2k tokens) over standard-library source
  (:mod:`draftheads.data.long_prompts`);
* ``spec_bench``: ``../shared/data/spec_bench/question.jsonl`` (or any path to a Spec-Bench
  ``question.jsonl``), one or two turns per question;
* ``gsm8k_test``: ``../shared/data/gsm8k/test.jsonl``;
* anything ``data.path`` accepts (a local file or folder, a hub id, ``embedded:pydoc``...):
  the user turns of each row, in every supported format (embedded: the train split only).

:func:`prompts_from_config` gives the prompts of a whole ``DataConfig`` (mixtures included) on
one side of the split; ``draftheads distill`` uses it, so held-out rows are never distilled.

Shared data paths are looked up relative to the working directory, then to the repository.
A missing file is a :class:`UserError` that names the path.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import check_prompt_source
from draftheads.data.copy_prompts import copy_items
from draftheads.data.embedded import embedded_items, humaneval_items
from draftheads.data.formats import RowError, check_format, detect_format, to_example
from draftheads.data.long_prompts import long_items
from draftheads.data.sources import SourceSpec, embedded_rows, raw_rows

if TYPE_CHECKING:
    from draftheads.data.prepare import SourceReport

SHARED = {
    "spec_bench": "spec_bench/question.jsonl",
    "gsm8k_test": "gsm8k/test.jsonl",
    "gsm8k_train": "gsm8k/train.jsonl",
    "codealpaca": "codealpaca/code_alpaca_2k.json",
}
REPO = Path(__file__).resolve().parents[1]


@dataclass
class PromptRow:
    """One prompt: the user turns of a conversation (later turns follow the model's answers)."""

    id: str
    category: str
    turns: list[str]


def shared_path(name: str) -> Path:
    """``../shared/data/<file>`` for a named shared data set, or a UserError saying where it looked."""
    rel = Path("..") / "shared" / "data" / SHARED[name]
    candidates = list(dict.fromkeys(p.resolve() for p in (Path.cwd() / rel, REPO / rel)))  # once each
    for p in candidates:
        if p.is_file():
            return p
    raise UserError(
        f"{name} data is absent: looked for {' and '.join(map(str, candidates))}; "
        f"give the file's path in place of the name {name} (e.g. eval.prompts=/path/to/{Path(SHARED[name]).name}, "
        f"or speed.sampling_sets=[heldout,/path/to/{Path(SHARED[name]).name}])"
    )


def _from_rows(path: str, fmt: str, fields: dict[str, str], category: str) -> list[PromptRow]:
    """The user turns of every usable row of ``path``; none usable is a UserError with the reasons."""
    spec = SourceSpec(name=path, path=path, format=check_format(fmt), fields=fields)
    rows = embedded_rows(spec, "train") if spec.embedded else raw_rows(spec)
    out, skipped, fmt_used, fields_used = [], Counter(), None if fmt == "auto" else fmt, fields
    for row_id, row in rows:
        if isinstance(row, RowError):
            skipped[str(row)] += 1
            continue
        if fmt_used is None:
            fmt_used, fields_used = detect_format(row.keys(), fields)
        try:
            ex = to_example(row, fmt_used, fields_used, row_id)
        except RowError as e:
            skipped[str(e)] += 1
            continue
        turns = ex.user_turns()
        if turns:
            out.append(PromptRow(ex.id, ex.category or category, turns))
        else:
            skipped["no user turn"] += 1
    if not out:
        raise UserError(
            f"no usable prompts in {path} ({reasons(skipped) or 'no rows'}); "
            "check the file, data.format and data.fields"
        )
    if skipped:
        print(
            f"load_prompts({path}): skipped {sum(skipped.values())} rows ({reasons(skipped)})",
            file=sys.stderr,
        )
    return out


def reasons(counts: Counter, most: int = 3) -> str:
    """``"3x invalid JSON, 1x empty text"``: the commonest skip reasons, for one-line messages."""
    return ", ".join(f"{n}x {r}" for r, n in counts.most_common(most))


def _renders(tokenizer, row: PromptRow) -> bool:
    from draftheads.data.chat import generation_prompt

    try:
        generation_prompt(tokenizer, [{"role": "user", "content": row.turns[0]}])
    except RowError:
        return False
    return True


def load_prompts(
    source: str, max_prompts: int | None = None, tokenizer=None, fmt: str = "auto", fields: dict | None = None
) -> list[PromptRow]:
    """The first ``max_prompts`` prompts of ``source``, in a fixed order.

    With ``tokenizer``, prompts its chat template cannot render are left out.
    """
    fields = dict(fields or {})
    if source == "heldout":
        rows = [PromptRow(it.id, it.component, [it.prompt]) for it in embedded_items("all", "heldout")]
    elif source == "humaneval":
        rows = [PromptRow(it.id, "humaneval", [it.prompt]) for it in humaneval_items()]
    elif source == "long":
        rows = [PromptRow(i, category, [text]) for i, category, text in long_items()]
    elif source == "copy":
        rows = [PromptRow(i, category, [text]) for i, category, text in copy_items()]
    elif source in SHARED:
        rows = _from_rows(str(shared_path(source)), fmt, fields, source.split("_")[0])
    else:
        p = Path(source).expanduser()
        if p.name == "question.jsonl" and not p.is_file():
            raise UserError(f"Spec-Bench file {source} is absent; check the path")
        check_prompt_source("eval.prompts", source)
        rows = _from_rows(source, fmt, fields, p.stem if p.exists() else source)
    if tokenizer is not None:
        n = len(rows)
        rows = [r for r in rows if _renders(tokenizer, r)]
        if n and not rows:
            raise UserError(
                f"none of the {n} prompts in {source} renders with the target's chat template; "
                "use a target with a chat template or other prompts"
            )
    return rows[:max_prompts] if max_prompts is not None else rows


def prompts_from_config(cfg, split: str = "train") -> list[PromptRow]:
    """The user turns of every row of ``cfg``'s sources on one side of the split, ids prefixed by source.

    Rows left out are counted and named on stderr as ``draftheads data`` reports them
    (:func:`left_out`): malformed rows (invalid JSON, bad encoding, an empty turn or
    answer...) and rows without a user turn.
    """
    from draftheads.data.prepare import SourceReport, examples, source_specs

    rows, why = [], []
    for spec in source_specs(cfg):
        report = SourceReport(spec.name, spec.path)
        for ex in examples(spec, split, report, strict=cfg.strict, system=None):
            if isinstance(ex, tuple):
                if cfg.strict:
                    raise UserError(
                        f"malformed row {ex[0]} in {spec.path}: {ex[1]}; fix it or set data.strict=false"
                    )
                report.skip(ex[0], str(ex[1]), malformed=True)
            elif ex.user_turns():
                rows.append(PromptRow(f"{spec.name}/{ex.id}", ex.category or spec.name, ex.user_turns()))
            else:
                report.skip(ex.id, "no user turn", malformed=False)
        if report.reasons:
            print(left_out(report), file=sys.stderr)
        why.append(
            f"{spec.path}: {report.read} read" + (f", {reasons(report.reasons)}" if report.reasons else "")
        )
    if not rows:
        raise UserError(
            f"no usable prompts in split {split} ({'; '.join(why)}); check data.path, data.format and data.fields"
        )
    return rows


def left_out(report: SourceReport) -> str:
    """The rows of one source that give no prompt, in ``draftheads data``'s words: how many of
    those read, the reasons, and the first malformed rows by ``file:line``."""
    head = (
        f"prompts of {report.name}: {report.skipped} skipped, {report.dropped} dropped of {report.read} "
        f"rows: {'; '.join(f'{n}x {r}' for r, n in report.reasons.most_common(5))}"
    )
    return "\n".join([head, *(f"  first skipped row {r}" for r in report.first_skips)])
