"""The workload stage of ``draftheads bench``: the main drafter beyond batch 1, on long and copy
prompts, and on its first call.

* ``workloads``: the rows of ``draftheads speed speed.workloads=true`` (:mod:`~draftheads.bench.workloads`)
  for the bench's main drafter: batches against batched greedy, the long set with prompt lookup
  beside it, and the copy set per category with lookup alone and prompt lookup beside it.
* ``first_call``: ``generate`` by a decoder built on an emptied verify-cost cache (it measures
  once, announced, before the timed call) against the same call by a decoder that reads that
  cache, in pairs: the first call's promise is that the cold call is within 10% of the warm one.

Cached in ``<out_dir>/workloads`` like every stage; the record lands in ``benchmarks.json``
(``workloads``, ``first_call``) and in the printed summary.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftheads.bench.stages import done, log, mark_done
from draftheads.conf.commands.args import BenchArgs, DecodeSpeedOptions, SpeedArgs
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.decode import DecodeConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

FIRST_CALL_PROMPT = "Explain what a Python generator is, with a short example."
PAIRS = 2  # cold and warm calls, alternated: two pairs show the machine's drift


def speed_args(cfg: BenchArgs, b: BenchConfig, heads: Path) -> SpeedArgs:
    """The ``draftheads speed speed.workloads=true`` settings this stage runs: batches 1/4/8 over
    8 held-out prompts, 4 long prompts, 2 of each copy category, and the long prompts sampled at
    temperatures 0.7 and 1.0 (where the planner must hold its floor against plain sampling)."""
    options = DecodeSpeedOptions(
        batch_sizes=[1, 4, 8],
        prompts=8,
        workloads=True,
        long_prompts=4,
        copy_per_category=2,
        temperatures=[0.7, 1.0],
        sampling_sets=["long"],
    )
    return SpeedArgs(target=cfg.target, decode=cfg.decode, heads=str(heads), speed=options)


def first_call_rows(target, tok, drafter, directory: str, decode: DecodeConfig) -> dict[str, Any]:
    """Tokens/s of the first ``generate`` of a decoder on an emptied cost cache (``cold``) and of
    one that reads it (``warm``), :data:`PAIRS` times; ``ratio``: cold over warm, per pair."""
    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.prompting import encode_prompt

    ids = encode_prompt(tok, FIRST_CALL_PROMPT).to(target.device)
    pairs = []
    for _ in range(PAIRS):
        with tempfile.TemporaryDirectory(prefix="draftheads-cost-") as cache:
            dc = replace(decode, cost_cache=cache)
            pair = {}
            for run in ("cold", "warm"):
                gen = SpeculativeGenerator(
                    target, drafter, tok, dc, tree_dir=directory
                )  # cold: measures here
                t0 = time.perf_counter()
                out = gen.generate(ids, max_new_tokens=decode.max_new_tokens, do_sample=False)
                seconds = time.perf_counter() - t0
                pair[run] = (out.shape[1] - ids.shape[1]) / seconds
            pair["ratio"] = pair["cold"] / pair["warm"]
            pairs.append(pair)
            log(
                f"first call: cold {pair['cold']:.1f} tok/s, warm {pair['warm']:.1f} tok/s ({pair['ratio']:.2f})"
            )
    return {"prompt": FIRST_CALL_PROMPT, "max_new_tokens": decode.max_new_tokens, "pairs": pairs}


def stage_workloads(
    cfg: BenchArgs, b: BenchConfig, target: PreTrainedModel, tok: PreTrainedTokenizerBase, heads: Path
) -> dict[str, Any]:
    """The workload and first-call rows for the drafter in ``heads`` (cached)."""
    from draftheads.bench.workloads import measure, settings
    from draftheads.heads import Drafter

    out = Path(b.out_dir) / "workloads"
    args = speed_args(cfg, b, heads)
    want = settings(args)
    if done(out, want):
        return json.loads((out / "record.json").read_text())
    log(f"workloads: {heads.name} at batches 1/4/8, long and copy prompts, and its first call")
    drafter = Drafter.from_pretrained(heads, target=target, tokenizer=tok, map_location=target.device)
    record = {"settings": want, **measure(args, target, tok, drafter, str(heads))}
    record["first_call"] = first_call_rows(target, tok, drafter, str(heads), cfg.decode)
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    mark_done(out, settings=want)
    return record


def workload_lines(record: dict[str, Any]) -> list[str]:
    """The stage's rows for the printed summary: each batch, the long set, each copy category
    (the drafter, lookup alone and prompt lookup) and the first-call pairs."""
    lines = []
    for r in record.get("batches", []):
        lines.append(
            f"workloads batch {r['batch']}: τ {r['tau']:.2f}  {r['speedup']:.2f}× vs plain {r.get('baseline', 'generate')}, "
            f"{r.get('speedup_vs_stock', 0.0):.2f}× vs stock"
        )
    if "long" in record:
        r = record["long"]
        lines.append(
            f"workloads long: τ {r['tau']:.2f}  {r['speedup']:.2f}× vs plain {r.get('baseline', 'generate')}  "
            f"| prompt lookup τ {r['pld']['tau']:.2f} {r['pld']['speedup']:.2f}×"
        )
    for name, r in record.get("copy", {}).items():
        for cat, c in {"all": r, **r.get("per_category", {})}.items():
            pld = c.get("pld") or {}
            lines.append(
                f"workloads copy {cat:<9} {name:<6}: τ {c['tau']:.2f}  {c['speedup']:.2f}× vs plain {c.get('baseline', 'generate')}  "
                f"| prompt lookup τ {pld.get('tau', 0.0):.2f} {pld.get('speedup', 0.0):.2f}×"
            )
    for source, rows in record.get("sampling", {}).items():
        for r in rows:
            lines.append(
                f"workloads sampling {source} T={r['temperature']}: τ {r['tau']:.2f}  {r['speedup']:.2f}× vs plain "
                f"{r.get('baseline', 'generate')} sampling"
            )
    for p in record.get("first_call", {}).get("pairs", []):
        lines.append(
            f"first call: cold {p['cold']:.1f} tok/s, warm {p['warm']:.1f} tok/s (cold/warm {p['ratio']:.2f})"
        )
    return lines


def workload_figures(record: dict[str, Any] | None) -> dict[str, Any]:
    """The workload stage's record as ``benchmarks.json`` keeps it: ``workloads`` (the rows of
    ``draftheads speed speed.workloads=true``) and ``first_call``; nothing when it did not run."""
    if not record:
        return {}
    rows = {k: v for k, v in record.items() if k != "first_call"}
    return {"workloads": {"command": "draftheads bench", **rows}, "first_call": record.get("first_call")}
