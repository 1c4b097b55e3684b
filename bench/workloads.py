"""``draftheads speed speed.workloads=true``: the decoder beyond batch 1, short prompts and greedy.

One run, one process, back to back, on the machine it runs on:

* ``backend``: the backend ``decode.backend`` chose for the target and the drafter, with every
  candidate's measured step (the alternative's timing);
* ``batches``: speculative against batched greedy ``generate`` on the same backend (and stock),
  at each of ``speed.batch_sizes``, over ``speed.prompts`` held-out prompts;
* ``long``: the long-context set (``eval.prompts=long``, ``speed.long_prompts`` of them), with
  transformers' prompt lookup beside it, as ``draftheads eval`` reports a set;
* ``copy``: the copy set (``eval.prompts=copy``, ``speed.copy_per_category`` prompts of each
  category), whose answers copy from their prompts: the drafter and lookup alone, transformers'
  prompt lookup beside them, per category;
* ``sampling``: speed and τ at each of ``speed.temperatures`` against the faster plain sampling
  loop on the same backend, on each of ``speed.sampling_sets`` (a set whose data is absent is
  left out, with a note; the long set takes the prompts its greedy rows take).

With ``speed.figures=PATH`` (``docs/benchmarks.json``) the record is written into that file's
``workloads`` key, the rest of the file kept; ``draftheads bench`` keeps it when it rewrites.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from draftheads.conf.commands.checks import writable_file
from draftheads.conf.errors import UserError
from draftheads.data.outdir import read_json

KEY = "workloads"


def check_figures(path: str | None) -> Path | None:
    """Refuse, before any work, a figures file that is not JSON or was not written by a bench run."""
    if path is None:
        return None
    out = writable_file(path, "speed.figures")
    if out.suffix != ".json":
        raise UserError(
            f"speed.figures={path} is not a .json file; give e.g. speed.figures=docs/benchmarks.json"
        )
    if out.exists():
        record = read_json(out)
        if not isinstance(record, dict) or not {"command", "settings"} <= set(record):
            raise UserError(
                f"speed.figures={path} was not written by draftheads bench and would be changed; "
                "give docs/benchmarks.json or a new file"
            )
    return out


def command_line() -> str:
    """The command that ran the rows: ``draftheads speed`` with its overrides (called from
    Python, the settings alone say how)."""
    args = sys.argv[1:]
    return (
        shlex.join(["draftheads", *args])
        if args[:1] == ["speed"]
        else "draftheads speed speed.workloads=true"
    )


def settings(args) -> dict[str, Any]:
    """What the rows depend on besides the machine: the drafter, the target and every
    ``speed.*`` and ``decode.*`` value."""
    from dataclasses import asdict

    target = f"tiny-{args.target.tiny}" if args.target.tiny else args.target.name_or_path
    return {"heads": args.heads, "target": target, "speed": asdict(args.speed), "decode": asdict(args.decode)}


def write_figures(record: dict[str, Any], path: Path, command: str) -> None:
    """Put ``record`` under ``workloads`` of ``path`` (a new file gets the command and settings keys)."""
    data = read_json(path) if path.exists() else None
    data = data if isinstance(data, dict) else {"command": command, "settings": {}}
    data[KEY] = {"command": command, **record}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def texts(source: str, n: int | None, tokenizer) -> list:
    """The first ``n`` prompts (None: all) of a named set (one per category for Spec-Bench), or
    [] with a note when its data is absent on this machine."""
    from draftheads.conf.commands.decode import first_per_category
    from draftheads.data.prompts import load_prompts

    try:
        rows = load_prompts(source, tokenizer=tokenizer)
    except UserError as err:
        print(f"speed: {source} left out: {err}", file=sys.stderr)
        return []
    return (first_per_category(rows, 1) if source == "spec_bench" else rows)[:n]


def fitting(prompts: list, tokenizer, limit: int | None, source: str) -> list:
    """The prompts whose first turn leaves room for an answer in the target's ``limit``
    positions; the others are left out with a note (a small target's context is shorter than
    the long set's prompts)."""
    from draftheads.decode.prompting import encode_prompt

    if limit is None:
        return prompts
    kept = [p for p in prompts if encode_prompt(tokenizer, p.turns[0]).shape[1] < limit]
    if len(kept) < len(prompts):
        print(
            f"speed: {len(prompts) - len(kept)} {source} prompts left out: longer than the target's "
            f"{limit} positions",
            file=sys.stderr,
        )
    return kept


def run(args) -> dict[str, Any]:
    """``draftheads speed speed.workloads=true``: load, measure, print, and write ``speed.figures``."""
    from draftheads.conf.commands.decode import load_decodable
    from draftheads.heads import Drafter
    from draftheads.heads.base import resolve_checkpoint_dir

    if not args.heads:
        raise UserError(
            "draftheads speed needs heads=DIR (a checkpoint directory or a hub id), or heads=none"
        )
    figures = check_figures(args.speed.figures)
    target, tok = load_decodable(args.target)
    directory, drafter = None, None
    if args.heads != "none":
        directory = resolve_checkpoint_dir(args.heads, args.revision)
        drafter = Drafter.from_pretrained(directory, target=target, tokenizer=tok, map_location=target.device)
    record = {"settings": settings(args), **measure(args, target, tok, drafter, directory and str(directory))}
    if figures is not None:
        write_figures(record, figures, command_line())
        print(f"workload rows written to {figures} ({KEY})")
    return record


def batch_rows(target, tok, drafter, prompts: list, args, directory: str | None) -> list[dict]:
    """Speculative against batched greedy ``generate`` at each of ``speed.batch_sizes``."""
    from draftheads.bench.decode_speed import format_rows, measure_speed

    s, dc = args.speed, args.decode
    texts_ = [p.turns[0] for p in prompts]
    rows = measure_speed(target, drafter, tok, texts_, tuple(s.batch_sizes), dc.max_new_tokens, dc, directory)
    print(format_rows(rows), flush=True)
    return rows


def long_rows(target, tok, drafter, prompts: list, decode) -> dict[str, Any]:
    """The long set as ``draftheads eval`` reports a set, transformers' prompt lookup beside it."""
    from draftheads.decode.evaluate import run_eval
    from draftheads.decode.report import summarize, summary_line

    turns = run_eval(target, tok, {"heads": drafter}, prompts, decode, ["pld"], progress=False)["heads"]
    report = summarize(turns, ["pld"])
    report.pop("per_category", None)
    print(f"long prompts: {summary_line(report, ['pld'])}", flush=True)
    return report


def copy_rows(target, tok, drafter, prompts: list, decode) -> dict[str, Any]:
    """The copy set (answers that copy from 1-2k token prompts) as ``draftheads eval`` reports
    it, per category: the drafter (with its lookup branches) and lookup alone decode the same
    turns in one loop, transformers' prompt lookup beside them."""
    from draftheads.decode.evaluate import run_eval
    from draftheads.decode.report import summarize, summary_line

    runs = {"heads": drafter, "lookup": None} if drafter is not None else {"lookup": None}
    turns = run_eval(target, tok, runs, prompts, decode, ["pld"], progress=False)
    out = {}
    for name, results in turns.items():
        out[name] = summarize(results, ["pld"])
        print(f"copy prompts, {name}: {summary_line(out[name], ['pld'])}", flush=True)
        for cat, r in out[name].get("per_category", {}).items():
            print(f"  {cat}: {summary_line(r, ['pld'])}", flush=True)
    return out


def sampling_rows(target, tok, drafter, prompts: list, decode, temperatures: list[float]) -> list[dict]:
    """Speed and τ at each temperature against same-backend sampling ``generate``."""
    from draftheads.decode.sampling_eval import format_rows, run_sampling

    rows = run_sampling(target, tok, drafter, prompts, decode, temperatures)
    print(format_rows(rows), flush=True)
    return rows


def measure(args, target, tok, drafter, directory: str | None) -> dict[str, Any]:
    """Every row of the module's list, printed as it is measured; returns the record."""
    from dataclasses import asdict

    from draftheads.conf.commands.decode import first_per_category
    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.context import position_limit

    s, dc = args.speed, args.decode
    gen = SpeculativeGenerator(target, drafter, tok, dc, tree_dir=directory)
    record: dict[str, Any] = {"backend": {c.part: asdict(c) for c in gen.choices}}
    held = texts("heldout", s.prompts, tok)
    record["batches"] = batch_rows(target, tok, drafter, held, args, directory)
    long = fitting(texts("long", None, tok), tok, position_limit(target.config), "long")[: s.long_prompts]
    if long:
        record["long"] = long_rows(target, tok, drafter, long, dc)
    copy = first_per_category(texts("copy", None, tok), s.copy_per_category)
    copy = fitting(copy, tok, position_limit(target.config), "copy")
    if copy:
        record["copy"] = copy_rows(target, tok, drafter, copy, dc)
    record["sampling"] = {}
    for source in s.sampling_sets:
        # the long set as its greedy rows take it: the first speed.long_prompts that fit
        whole = source == "long"
        prompts = texts(source, None if whole else s.prompts, tok)
        prompts = fitting(prompts, tok, position_limit(target.config), source)[
            : s.long_prompts if whole else None
        ]
        if prompts:
            print(f"sampling, {source}:", flush=True)
            record["sampling"][source] = sampling_rows(
                target, tok, drafter, prompts, dc, list(s.temperatures)
            )
    return record
