"""``draftheads push``, ``export`` and ``info``: a checkpoint's ways out, over the heads package."""

from __future__ import annotations

from pathlib import Path

from draftheads.conf.commands.args import ExportArgs, InfoArgs, PushArgs
from draftheads.conf.commands.checks import drafter_digest
from draftheads.conf.errors import UserError
from draftheads.data.outdir import claimed, read_json, writable_dir

REPORT = "report.json"


def push(args: PushArgs) -> str:
    """Upload ``heads`` with a model card, quoting the newest eval report measured on this drafter.

    Nothing is written locally (the card is uploaded from memory). A report is this drafter's
    when it records this drafter's weights digest (``drafter_sha256``, written by ``eval``); one
    in the heads folder itself that records none is taken as the user placed it.
    """
    from draftheads.heads.hub import push_folder

    if not args.heads or not args.repo_id:
        raise UserError("draftheads push needs heads=DIR and repo_id=ORG/NAME")
    report = own_report(Path(args.heads).expanduser(), args.eval.output_dir)
    url = push_folder(
        args.heads, args.repo_id, private=bool(args.private), revision=args.revision, report=report
    )
    print(f"pushed {args.heads} to {args.repo_id}{'@' + args.revision if args.revision else ''}: {url}")
    return url


def report_candidates(heads: Path, out_dir: str | None) -> list[Path]:
    """The eval reports that may belong to ``heads``: its own, its ``eval-*`` folders' and ``eval.out_dir``'s."""
    found = [heads / REPORT, *sorted(heads.glob(f"eval-*/{REPORT}"))]
    if out_dir:
        found.append(Path(out_dir).expanduser() / REPORT)
    return [p for p in dict.fromkeys(found) if p.is_file()]


def own_report(heads: Path, out_dir: str | None) -> Path | None:
    """The newest report measured on this drafter (None: none). With none, a report.json in the
    heads folder that records another drafter is refused in one line (push would quote it)."""
    digest = drafter_digest(heads) if heads.is_dir() else None
    if digest is None:
        return None  # no local weights: push refuses the folder itself
    mine, theirs = [], []
    for path in report_candidates(heads, out_dir):
        recorded = (read_json(path) or {}).get("drafter_sha256")
        own = recorded == digest or (recorded is None and path == heads / REPORT)
        (mine if own else theirs).append(path)
    if not mine and heads / REPORT in theirs:
        raise UserError(
            f"{heads / REPORT} was measured on another drafter (its drafter_sha256 differs from these "
            f"weights); delete it or rerun `draftheads eval heads={heads}` before pushing"
        )
    return max(mine, key=lambda p: p.stat().st_mtime) if mine else None


def export(args: ExportArgs) -> Path:
    """Write ``heads`` for vLLM or SGLang, or in vLLM's speculators format, into ``out_dir``: a new
    or empty folder, or an earlier export (never the checkpoint itself, never inside a training run)."""
    from draftheads.heads.export import export as export_checkpoint

    if not args.heads or not args.format or not args.out:
        raise UserError("draftheads export needs heads=DIR format=vllm|sglang|speculators out_dir=DIR")
    out = writable_dir(args.out, "out_dir")
    heads = Path(args.heads).expanduser()
    if heads.is_dir() and out.exists() and out.resolve() == heads.resolve():
        raise UserError(f"out_dir={args.out} is the checkpoint itself; export into a new directory")
    with claimed(args.out, "export", "out_dir"):
        return export_checkpoint(args)


def info(args: InfoArgs) -> None:
    """Print a checkpoint's kind, shapes and target fingerprint."""
    from draftheads.heads.commands import info as show_info

    show_info(args)
