"""``draftheads push``, ``export`` and ``info``: a checkpoint's ways out, over the heads package."""

from __future__ import annotations

from pathlib import Path

from draftheads.conf.commands.args import ExportArgs, InfoArgs, PushArgs
from draftheads.conf.commands.checks import writable_dir
from draftheads.conf.errors import UserError


def push(args: PushArgs) -> str:
    """Upload ``heads`` with a model card (and its eval report, if found) to ``repo_id``."""
    from draftheads.heads.hub import push as push_checkpoint

    return push_checkpoint(args)


def export(args: ExportArgs) -> Path:
    """Write ``heads`` for vLLM or SGLang into ``out_dir``: never over the checkpoint itself."""
    from draftheads.heads.export import export as export_checkpoint

    if not args.heads or not args.format or not args.out:
        raise UserError("draftheads export needs heads=DIR format=vllm|sglang out_dir=DIR")
    out = writable_dir(args.out, "out_dir")
    heads = Path(args.heads).expanduser()
    if heads.is_dir() and out.exists() and out.resolve() == heads.resolve():
        raise UserError(f"out_dir={args.out} is the checkpoint itself; export into a new directory")
    return export_checkpoint(args)


def info(args: InfoArgs) -> None:
    """Print a checkpoint's kind, shapes and target fingerprint."""
    from draftheads.heads.commands import info as show_info

    show_info(args)
