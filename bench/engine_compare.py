"""``draftheads engine``: vLLM's acceptance beside draftheads' on the same prompts and chain.

The drafter is exported as ``draftheads export`` exports it (into a temporary folder, naming the
served target folder as its verifier), vLLM serves each export offline
(:func:`~draftheads.bench.engine_acceptance.run_engine`) on the chat-templated token ids of the
prompt set, and draftheads' decoder runs the same chain on the same ids
(:func:`~draftheads.bench.engine_acceptance.our_counters`). One table compares, per format,
vLLM's mean acceptance length (``1 + accepted / drafts``) with draftheads', their drafting
steps, accepted tokens and per-position acceptance, and whether each engine's outputs are the
target's greedy ones; ``engine.out`` receives the same record as JSON.

Both engines decode greedily and stop at the target's end-of-sequence token. Every input a user
can get wrong is refused in one line before any engine starts: no vLLM (``make engine``), a
drafter vLLM's CPU build cannot serve (a head size below 32), a format the drafter has no form
in, a chain its kind cannot change, an unknown prompt set or a count below 1.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from draftheads.bench.engine_acceptance import (
    check_engine,
    counted,
    greedy_outputs,
    mean_acceptance_length,
    our_counters,
    run_engine,
)
from draftheads.conf.commands.args import ENGINE_FORMATS, EngineArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TargetConfig

KV_FLOOR = 128 * 2**20  # the smallest KV cache given to vLLM (it holds the drafter's layers too)
LENGTH_SLACK = 64  # positions beyond the longest request, so vLLM never drafts less near the end


def served_target(target: TargetConfig) -> str:
    """What vLLM serves as the target: the embedded SmolLM2's converted folder, a local folder,
    or a Hub id; a tiny target exists only in memory and is refused."""
    from draftheads.heads.target.embedded import convert_smollm2

    if target.tiny:
        raise UserError(
            f"target.tiny={target.tiny} is built in memory, and vLLM loads a folder; save it with "
            "save_pretrained and pass target.name_or_path=DIR"
        )
    if target.name_or_path == "smollm2":
        return str(convert_smollm2(target))
    return (
        str(Path(target.name_or_path).expanduser())
        if Path(target.name_or_path).expanduser().is_dir()
        else target.name_or_path
    )


def check_out_file(out: str | None) -> Path | None:
    """The JSON file ``engine.out``, refused when it is a folder or its folder cannot be written."""
    from draftheads.data.outdir import writable_dir

    if out is None:
        return None
    path = Path(out).expanduser()
    if path.is_dir():
        raise UserError(
            f"engine.out={out} is a folder; give a JSON file path (e.g. engine.out={out}/engine.json)"
        )
    writable_dir(path.parent, "engine.out's folder")
    return path


def formats_for(drafter, asked: str | None) -> tuple[list[str], str | None]:
    """The export formats to serve, and a note when speculators is left out: ``asked`` alone, or
    both where the drafter has a speculators form. Asking for a form it lacks is refused."""
    from draftheads.heads.kinds import drafter_kind

    refusal = drafter_kind(drafter.kind).speculators_refusal(drafter.kind_config())
    if asked == "speculators" and refusal:
        raise UserError(f"engine.format=speculators: {refusal}")
    if asked:
        return [asked], None
    if refusal:
        return ["vllm"], f"note: format=speculators left out ({refusal})"
    return list(ENGINE_FORMATS), None


def chain_for(drafter, asked: int | None) -> int:
    """Drafted tokens per step: ``engine.chain``, else the model card's. A kind that drafts any chain
    (``any_chain``) takes any count; other kinds are served with exactly their own, so another is refused."""
    from draftheads.heads.card import num_speculative_tokens
    from draftheads.heads.kinds import drafter_kind

    own = num_speculative_tokens(drafter.kind_config())
    if asked is None or asked == own:
        return own
    if not drafter_kind(drafter.kind).any_chain:
        raise UserError(
            f"engine.chain={asked}: a {drafter.kind} drafter is served with exactly {own} drafted tokens "
            f"per step; drop engine.chain (or use engine.chain={own})"
        )
    return asked


def check_servable(drafter) -> None:
    """Refuse a drafter vLLM's CPU build cannot serve (an attention head size below its minimum)."""
    from draftheads.heads.export import vllm_cpu_note

    note = vllm_cpu_note(drafter)
    if note:
        raise UserError(note.removeprefix("note: ") + " (draftheads engine runs vLLM's CPU build)")


def engine_limits(model, prompts: list[list[int]], new_tokens: int, chain: int) -> dict:
    """This machine's engine arguments (none is about the drafter): the target's float type, a
    context that holds the longest request with room to spare, a KV cache for every prompt at
    once, and no compilation (a CPU start takes minutes)."""
    cfg = model.config
    length = max(map(len, prompts)) + new_tokens + 2 * chain + LENGTH_SLACK
    length = min(-(-length // 64) * 64, getattr(cfg, "max_position_embeddings", None) or length)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    per_token = 2 * (cfg.num_hidden_layers + 1) * kv_heads * head * 4
    return {
        "dtype": str(model.dtype).removeprefix("torch."),
        "max_model_len": length,
        "kv_cache_memory_bytes": max(KV_FLOOR, 2 * per_token * length * len(prompts)),
        "enforce_eager": True,
    }


def load_prompt_ids(tok, source: str, count: int) -> list[list[int]]:
    """The first turn of the first ``count`` prompts of ``source``, chat-templated as draftheads
    decodes them: the same ids go to both engines."""
    from draftheads.data.prompts import load_prompts
    from draftheads.decode.prompting import encode_prompt

    rows = load_prompts(source, count, tokenizer=tok)
    return [encode_prompt(tok, row.turns[0])[0].tolist() for row in rows]


def preflight(drafter, opts) -> tuple[list[str], str | None, int]:
    """The formats to serve (and a note on one left out) and the chain, for ``drafter``; a drafter
    vLLM cannot serve, or cannot serve so, is refused in one line."""
    check_servable(drafter)
    formats, note = formats_for(drafter, opts.format)
    return formats, note, chain_for(drafter, opts.chain)


def light_preflight(heads: str, revision: str | None, opts) -> None:
    """:func:`preflight` on the drafter alone, before vLLM is looked for and the target loads,
    where the drafter loads without its target (see ``draftheads export``)."""
    from draftheads.heads import Drafter
    from draftheads.heads.checkpoint import resolve_checkpoint_dir
    from draftheads.heads.export import needs_target

    directory = resolve_checkpoint_dir(heads, revision)
    if not needs_target(directory):
        preflight(Drafter.from_pretrained(directory), opts)


def engine(args: EngineArgs) -> dict:
    """Export, serve with vLLM, decode with draftheads, print the table; returns the record."""
    from draftheads.conf.commands.decode import load

    opts = args.engine
    if not args.heads or args.heads == "none":
        raise UserError(
            "draftheads engine needs heads=DIR (a drafter checkpoint directory or a hub id ORG/NAME)"
        )
    out = check_out_file(opts.out)
    light_preflight(args.heads, args.revision, opts)
    check_engine()
    served = served_target(args.target)
    model, tok, drafter, directory = load(args.heads, args.revision, args.target, "engine")
    formats, note, chain = preflight(drafter, opts)
    prompts = load_prompt_ids(tok, opts.prompts, opts.max_prompts)
    new = args.decode.max_new_tokens
    greedy = greedy_outputs(model, prompts, new)
    ours = our_counters(drafter, model, tok, prompts, chain, new, args.decode.backend)
    limits = engine_limits(model, prompts, new, chain)
    verifier = served if Path(served).is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="draftheads-engine-"))
    served_by = {fmt: serve(drafter, directory, fmt, work / fmt, verifier, chain) for fmt in formats}
    vllm = {
        fmt: run_engine(cmd, prompts, new, limits, work / fmt, ignore_eos=False)
        for fmt, cmd in served_by.items()
    }
    shutil.rmtree(work, ignore_errors=True)
    record = build_record(args, str(directory), served, chain, greedy, ours, vllm, served_by)
    if note:
        print(note)
    print(table(record))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {out}")
    return record


def serve(drafter, directory: Path, fmt: str, out: Path, verifier: str | None, chain: int) -> str:
    """Export ``drafter`` in ``fmt`` into ``out`` as ``draftheads export`` does; its serve command
    with ``chain`` drafted tokens per step."""
    from draftheads.heads.export import export_drafter, serve_line
    from draftheads.heads.speculators import check_verifier_folder

    if verifier:
        verifier = check_verifier_folder(verifier, drafter.target_fingerprint)
    out.mkdir(parents=True, exist_ok=True)
    export_drafter(drafter, fmt, out / "export", source=directory, verifier=verifier, tokens=chain)
    return serve_line(drafter, fmt, out / "export", verifier, chain)


def engine_row(report: dict, greedy: list[list[int]]) -> dict:
    """One engine's counters, mean acceptance length and per-position acceptance rates, and how
    many of its outputs are the target's greedy ones."""
    drafts = report.get("num_drafts") or 0
    return {
        **counted(report),
        "mean_acceptance_length": mean_acceptance_length(report),
        "acceptance_per_position": [
            n / drafts if drafts else 0.0 for n in report.get("accepted_per_position") or []
        ],
        "greedy_outputs": sum(a == b for a, b in zip(report["outputs"], greedy)),
        "outputs": report["outputs"],
    }


def build_record(args, heads, served, chain, greedy, ours, vllm, served_by) -> dict:
    """The whole comparison as one JSON-ready dict."""
    mine = engine_row(ours, greedy)
    formats = {}
    for fmt, report in vllm.items():
        row = engine_row(report, greedy)
        row.update(command=served_by[fmt], vllm_version=report.get("vllm_version"))
        row["counters_equal"] = counted(report) == counted(ours)
        formats[fmt] = row
    return {
        "heads": heads,
        "target": served,
        "prompts": args.engine.prompts,
        "num_prompts": len(greedy),
        "max_new_tokens": args.decode.max_new_tokens,
        "chain": chain,
        "greedy": greedy,
        "draftheads": mine,
        "vllm": formats,
    }


def table(record: dict) -> str:
    """The printed comparison: one row per vLLM format, then draftheads' decoder."""
    n = record["num_prompts"]
    head = (
        f"vLLM and draftheads on {n} {record['prompts']} prompts, {record['max_new_tokens']} new tokens, "
        f"chain {record['chain']} ({record['heads']})"
    )
    cols = f"{'engine':<24}{'mean acc. len':>14}{'steps':>8}{'drafted':>9}{'accepted':>10}  {'per position':<24}{'= greedy':>9}{'= ours':>8}"
    lines = [head, cols]
    rows = [(f"vLLM, format={fmt}", row) for fmt, row in record["vllm"].items()]
    for name, row in [*rows, ("draftheads", record["draftheads"])]:
        rates = " ".join(f"{r:.2f}" for r in row["acceptance_per_position"])
        same = ("yes" if row["counters_equal"] else "NO") if "counters_equal" in row else "-"
        lines.append(
            f"{name:<24}{row['mean_acceptance_length']:>14.2f}{row['num_drafts']:>8}{row['num_draft_tokens']:>9}"
            f"{row['num_accepted_tokens']:>10}  {rates:<24}{row['greedy_outputs']:>5}/{n:<3}{same:>8}"
        )
    return "\n".join(lines)
