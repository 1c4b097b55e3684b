"""``draftheads generate``, ``tree`` and ``eval``: decoding with a trained drafter."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from draftheads.conf.commands.args import EvalArgs, GenerateArgs, TreeArgs
from draftheads.conf.commands.checks import drafter_digest
from draftheads.conf.errors import UserError
from draftheads.data.outdir import claimed, guard_out_dir, is_tree_record


def load(heads: str | None, revision: str | None, target_cfg, command: str):
    """``(target, tokenizer, drafter, checkpoint directory)`` for ``heads=`` (a directory or hub id;
    ``none``: no drafter, lookup decoding alone)."""
    from draftheads.heads import Drafter
    from draftheads.heads.base import resolve_checkpoint_dir

    if not heads:
        raise UserError(
            f"draftheads {command} needs heads=DIR (a checkpoint directory or a hub id ORG/NAME), "
            "or heads=none for lookup decoding without a drafter"
        )
    if heads == "none":
        if command == "tree":
            raise UserError(
                "draftheads tree measures heads that index a static tree by depth; "
                "pass heads=DIR of such heads, not none"
            )
        target, tok = load_decodable(target_cfg)
        return target, tok, None, None
    directory = resolve_checkpoint_dir(heads, revision)
    target, tok = load_decodable(target_cfg)
    drafter = Drafter.from_pretrained(directory, target=target, tokenizer=tok, map_location=target.device)
    return target, tok, drafter, directory


def load_decodable(target_cfg):
    """The target and its tokenizer, refused in one line when its own generation config asks for
    a decoding the speculative decoder cannot verify (beam search)."""
    from draftheads.heads.target.load import (
        check_generation_file,
        generation_file,
        load_target,
        unverifiable_generation,
    )

    folder = None if target_cfg.tiny else Path(target_cfg.name_or_path).expanduser()
    if folder is not None and folder.is_dir():  # a local target: refused before any weight is read
        problem = unverifiable_generation(check_generation_file(generation_file(folder)), target_cfg)
        if problem:
            raise UserError(problem)
    target, tok = load_target(target_cfg)
    gc = getattr(target, "generation_config", None)
    problem = unverifiable_generation(gc.to_dict() if gc is not None else {}, target_cfg)
    if problem:
        raise UserError(problem)
    return target, tok


def generate(args: GenerateArgs) -> None:
    """Stream the answer to ``prompt`` as it is accepted, then print τ and tokens/s."""
    from transformers import TextStreamer

    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.context import fit_new_tokens, position_limit
    from draftheads.decode.prompting import encode_prompt

    if not args.prompt:
        raise UserError(
            'draftheads generate needs a prompt: prompt="...", --prompt "..." or prompt_file=PATH'
        )
    target, tok, drafter, directory = load(args.heads, args.revision, args.target, "generate")
    ids = encode_prompt(tok, args.prompt, args.decode.chat)
    limit = position_limit(target.config)
    max_new, note = fit_new_tokens(ids.shape[1], args.decode.max_new_tokens, limit, "decode.max_new_tokens")
    if note:
        print(note, file=sys.stderr)
    gen = SpeculativeGenerator(target, drafter, tok, args.decode, tree_dir=directory and str(directory))
    for line in gen.backend_lines():
        print(line, file=sys.stderr)
    torch.manual_seed(args.decode.seed)
    streamer = TextStreamer(tok, skip_special_tokens=True)
    for step in gen.stream(ids.to(target.device), max_new_tokens=max_new):
        streamer.put(torch.tensor(step[0], dtype=torch.long))
    streamer.end()
    s = gen.last_stats
    print(
        f"\n[{s.new_tokens} tokens in {s.total_time_s:.2f}s: {s.tokens_per_s:.1f} tokens/s, "
        f"tau {s.tau:.2f} over {s.target_forwards - 1} steps (+1 prefill), backend {s.backend}; "
        f"{s.split_line()}]"
    )


def tree_path(args: TreeArgs) -> Path:
    """Where tree.json goes: ``out_dir`` (a ``.json`` file, or a folder to hold tree.json), else
    beside local heads (else ``./tree.json``). Refused before any work: a folder the guard refuses
    (:func:`draftheads.data.outdir.guard_out_dir`) and a tree.json that ``draftheads tree`` did not
    write (it would be replaced)."""
    from draftheads.decode.tree import TREE_FILE

    out = Path(args.out).expanduser() if args.out else None
    if out is not None and out.suffix == ".json" and not out.is_dir():
        path = guard_out_dir(out.parent, "file", "out_dir") / out.name
    elif args.out is not None:
        path = guard_out_dir(args.out, "tree", "out_dir") / TREE_FILE
    elif args.heads and Path(args.heads).expanduser().is_dir():
        path = guard_out_dir(Path(args.heads).expanduser(), "tree", "out_dir") / TREE_FILE
    else:
        path = guard_out_dir(".", "file", "out_dir") / TREE_FILE
    if path.exists() and not is_tree_record(path):
        raise UserError(
            f"{path} is not a tree draftheads tree wrote, and it would be replaced; move it away or "
            f"pass out_dir=FILE.json elsewhere (e.g. out_dir=outputs/tree.json)"
        )
    return path


def tree(args: TreeArgs) -> None:
    """Measure per-head top-k accuracies on held-out prompts and save the best tree as tree.json."""
    from draftheads.data.prompts import load_prompts
    from draftheads.decode.tree_select import select_tree
    from draftheads.heads.files import atomic_write

    dc = args.decode
    if dc.tree_size < 0 or dc.tree_topk < 1 or dc.tree_prompts < 1 or dc.tree_new_tokens < 1:
        raise UserError(
            f"decode.tree_size={dc.tree_size}, tree_topk={dc.tree_topk}, tree_prompts={dc.tree_prompts}, "
            f"tree_new_tokens={dc.tree_new_tokens}: need size >= 0 and the others >= 1"
        )
    out = tree_path(args) if args.out is not None or args.heads else None
    target, tok, drafter, _ = load(args.heads, args.revision, args.target, "tree")
    rows = load_prompts("heldout", max_prompts=dc.tree_prompts, tokenizer=tok)
    with claimed(out.parent, "file", "out_dir"):  # one writer at a time (checked above)
        record = select_tree(target, drafter, tok, [r.turns[0] for r in rows], dc)
        text = json.dumps(record, indent=1) + "\n"
        atomic_write(out, lambda p: p.write_text(text))  # an interrupt leaves the old tree or the new
    print(f"tree of {record['size']} tokens (expected tau {record['expected_tau']:.2f}) saved to {out}")
    if not Path(str(args.heads)).expanduser().is_dir() and not args.out:
        print(f"(heads= is a hub id; pass decode.tree={out} to use it)")


def first_per_category(prompts: list, n: int) -> list:
    """The first ``n`` prompts of every category, categories in sorted order."""
    per: dict[str, list] = {}
    for p in prompts:
        per.setdefault(p.category or "all", []).append(p)
    return [p for cat in sorted(per) for p in per[cat][:n]]


def slug(text: str) -> str:
    """A folder-name form of a prompt set or drafter name (a file path: its stem)."""
    name = Path(text).expanduser().stem if Path(text).expanduser().exists() else text
    return re.sub(r"[^\w.-]+", "-", name).strip("-.") or "prompts"


def default_eval_dir(heads: str | None, prompts: str) -> Path:
    """Where a report goes without ``eval.out_dir``: a folder of this drafter's own,
    ``<heads>/eval-<prompts>`` beside a local drafter (as ``draftheads bench`` lays them out),
    else ``outputs/eval/<hub id or lookup>-<prompts>``."""
    if heads and heads != "none" and Path(heads).expanduser().is_dir():
        return Path(heads).expanduser() / f"eval-{slug(prompts)}"
    who = "lookup" if heads in (None, "none") else slug(heads)
    return Path("outputs") / "eval" / f"{who}-{slug(prompts)}"


def same_drafter(a: str | None, b: str | None) -> bool:
    """Whether two ``heads=`` values (or two ``eval.prompts=`` values) name one drafter or prompt
    set: the same text, or the same local folder or file."""
    if str(a) == str(b):
        return True
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def check_report_owner(
    out: Path, heads: str | None, prompts: str | None = None, default: bool = False
) -> None:
    """Refuse an ``eval.out_dir`` whose report measured another drafter, or other prompts (another
    file of the same name lands in the same default folder): writing there would replace that
    report (its report.json, report.md, turns and plots)."""
    from draftheads.data.outdir import read_json

    report = read_json(Path(out).expanduser() / "report.json") or {}
    if "heads" in report and not same_drafter(report["heads"], heads or "none"):
        raise UserError(
            f"eval.out_dir={out} holds the report of heads={report['heads']}, which this run would "
            f"replace; choose another eval.out_dir, or leave it unset for a folder of this drafter's own"
        )
    if prompts is not None and "prompts" in report and not same_drafter(report["prompts"], prompts):
        where = f"{out} (the default eval.out_dir)" if default else f"eval.out_dir={out}"
        raise UserError(
            f"{where} holds the report on eval.prompts={report['prompts']}, which this run on "
            f"eval.prompts={prompts} would replace; set eval.out_dir to another folder for these prompts"
        )


def read_prompts(e, tokenizer=None) -> list:
    """The prompts of ``eval.prompts``, read with ``eval.format`` and ``eval.fields`` (the first
    ``per_category`` of each category, then ``max_prompts``); none is refused in one line."""
    from draftheads.data.prompts import load_prompts

    try:
        prompts = load_prompts(e.prompts, tokenizer=tokenizer, fmt=e.format, fields=e.fields)
    except UserError as err:  # the data layer names the data.* keys; eval reads its own
        own = {"data.path=": "eval.prompts=", "data.format": "eval.format", "data.fields": "eval.fields"}
        msg = str(err)
        for theirs, ours in own.items():
            msg = msg.replace(theirs, ours)
        raise UserError(msg) from None
    if e.per_category:
        prompts = first_per_category(prompts, e.per_category)
    prompts = prompts[: e.max_prompts] if e.max_prompts else prompts
    if not prompts:
        raise UserError(f"eval.prompts={e.prompts} gave no prompts; check the path or name")
    return prompts


def evaluate(args: EvalArgs) -> dict:
    """τ and speedup on ``eval.prompts``; writes report.json, report.md and plots to ``eval.out_dir``
    (by default a folder of the drafter's own, :func:`default_eval_dir`). The report records the
    drafter's weights digest, so ``push`` quotes it only on that drafter."""
    from draftheads.decode.evaluate import check_baselines

    e = args.eval
    baselines = list(e.baselines or [])
    if e.assistant_model and "assisted" not in baselines:
        baselines.append("assisted")
    check_baselines(baselines, bool(e.assistant_model))
    out = e.output_dir if e.output_dir is not None else default_eval_dir(args.heads, e.prompts)
    guard_out_dir(out, "eval", "eval.out_dir")
    check_report_owner(out, args.heads, e.prompts, default=e.output_dir is None)
    read_prompts(e)  # a prompt file that yields nothing stops here, before the target loads
    with claimed(out, "eval", "eval.out_dir") as folder:
        return measure(args, baselines, folder)


def measure(args: EvalArgs, baselines: list[str], out: Path) -> dict:
    """Decode ``eval.prompts`` with the drafter and the baselines; write the report into ``out``."""
    from draftheads.decode.evaluate import run_eval
    from draftheads.decode.report import environment, split_line, summarize, summary_line, write_report
    from draftheads.decode.sampling_eval import run_sampling, summary

    e = args.eval
    target, tok, drafter, directory = load(args.heads, args.revision, args.target, "eval")
    prompts = read_prompts(e, tok)
    assistant = None
    if e.assistant_model:
        from transformers import AutoModelForCausalLM

        try:
            assistant = AutoModelForCausalLM.from_pretrained(e.assistant_model).to(target.device)
        except (OSError, ValueError) as err:  # a hub id that is not there, or no causal LM
            raise UserError(
                f"eval.assistant_model={e.assistant_model} could not be loaded "
                f"({str(err).strip().splitlines()[0][:200]}); give a model folder holding config.json, "
                "or a hub model id ORG/NAME"
            ) from None
    runs = run_eval(target, tok, {"heads": drafter}, prompts, args.decode, baselines, assistant, e.warmup)
    results = runs["heads"]
    report = summarize(results, baselines)
    report["sampling"] = run_sampling(target, tok, drafter, prompts, args.decode, e.temperatures)
    env = environment(target, args.decode)
    report.update(
        prompts=e.prompts,
        heads=str(args.heads),
        drafter=drafter.kind if drafter else "lookup",
        drafter_sha256=drafter_digest(directory) if directory else None,
        environment=env,
    )
    write_report(report, results, baselines, out)
    print(summary_line(report, baselines))
    print(split_line(report))
    if report["sampling"]:
        print(f"sampling: {summary(report['sampling'])}")
    print(f"report: {out / 'report.json'}")
    return report
