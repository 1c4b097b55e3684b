"""Publish a drafter checkpoint to the Hugging Face Hub, with a model card.

``draftheads push heads=DIR repo_id=ORG/NAME [private=true] [revision=BRANCH]`` and
``Drafter.push_to_hub(repo_id)`` upload ``config.json``, ``model.safetensors`` and a
``README.md`` model card (:mod:`draftheads.heads.card`), and the eval report it quotes.

Loading back is ``Drafter.from_pretrained("ORG/NAME", revision=...)`` (huggingface_hub's
download and cache; offline from the cache with ``HF_HUB_OFFLINE=1``).

The token comes from huggingface_hub's usual sources (``HF_TOKEN``, ``hf auth login``); this
module never reads, prints or logs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.heads.card import REPO_ID, model_card
from draftheads.heads.checkpoint import (
    ADAPTER_DIR,
    CONFIG_NAME,
    WEIGHTS_NAME,
    load_checkpoint,
    read_config,
)
from draftheads.heads.kinds import drafter_kind

CARD_NAME = "README.md"
REPORT_NAME = "report.json"
OPTIONAL_FILES = ("tree.json", "resolved_config.yaml")


def read_report(path: Path) -> dict[str, Any]:
    """A draftheads eval ``report.json``; a one-line error when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); rerun draftheads eval") from None
    if not isinstance(data, dict) or "tau" not in data:
        raise UserError(f"{path} is not a draftheads eval report (no 'tau')")
    return data


def _same_dir(a: Any, b: Path) -> bool:
    return bool(a) and Path(str(a)).expanduser().resolve() == b.resolve()


def find_report(
    heads_dir: Path, report: str | os.PathLike | None = None, search: tuple[str | os.PathLike, ...] = ()
) -> Path | None:
    """The eval report to quote: ``report`` if given (a report.json or its directory); else the
    newest of ``heads_dir/report.json`` and any report in ``search`` directories whose ``heads``
    field is this heads directory (``draftheads eval`` writes to ``eval.output_dir``)."""
    if report:
        path = Path(report) / REPORT_NAME if Path(report).is_dir() else Path(report)
        if not path.is_file():
            raise UserError(
                f"report={report}: no {REPORT_NAME} there; run draftheads eval first or drop report="
            )
        read_report(path)
        return path
    found = [heads_dir / REPORT_NAME] if (heads_dir / REPORT_NAME).is_file() else []
    for d in search:
        path = Path(d) / REPORT_NAME
        if path.is_file() and path.resolve() not in {f.resolve() for f in found}:
            try:
                if _same_dir(json.loads(path.read_text()).get("heads"), heads_dir):
                    found.append(path)
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue
    return max(found, key=lambda f: f.stat().st_mtime) if found else None


def files_to_push(heads_dir: Path) -> dict[str, Path]:
    """What a published drafter holds: weights and config, the target's LoRA adapters (``adapter/``),
    the measured decoding tree and the resolved training config when present; never optimizer
    checkpoints."""
    files = {CONFIG_NAME: heads_dir / CONFIG_NAME, WEIGHTS_NAME: heads_dir / WEIGHTS_NAME}
    for name in OPTIONAL_FILES:
        if (heads_dir / name).is_file():
            files[name] = heads_dir / name
    adapters = heads_dir / ADAPTER_DIR
    if adapters.is_dir():
        for f in sorted(adapters.rglob("*")):
            if f.is_file():
                files[f.relative_to(heads_dir).as_posix()] = f
    return files


def push_folder(
    heads_dir: str | os.PathLike,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    token: str | None = None,
    commit_message: str | None = None,
    report: str | os.PathLike | None = None,
    endpoint: str | None = None,
    search: tuple[str | os.PathLike, ...] = (),
) -> str:
    """Upload a draftheads checkpoint directory with its model card; returns the commit URL.

    The checkpoint is read and validated first (a damaged one is never published). ``token``
    None means huggingface_hub's usual sources. ``revision`` is a branch, created if missing.
    The eval report quoted (and uploaded as report.json) is ``report``, or the newest one found
    in ``heads_dir`` and the ``search`` directories (see :func:`find_report`).
    """
    import httpx2
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    heads_dir = Path(heads_dir)
    if not REPO_ID.match(repo_id or ""):
        raise UserError(f"repo_id={repo_id!r} is not a Hub repo id; use repo_id=ORG/NAME")
    if not heads_dir.is_dir():
        raise UserError(f"heads={heads_dir}: no such checkpoint directory")
    conf = read_config(heads_dir)
    load_checkpoint(heads_dir)  # config and weights agree, all finite: never publish a damaged one
    if conf.get("requires_adapters") and not (heads_dir / ADAPTER_DIR).is_dir():
        short = drafter_kind(conf["kind"]).describe_short(conf)
        raise UserError(
            f"{heads_dir} ({short}, trained with LoRA adapters on the target) needs its {ADAPTER_DIR}/ "
            "(the adapters), which is missing; push the whole folder `draftheads train` wrote"
        )
    report_path = find_report(heads_dir, report, search)
    card = model_card(conf, repo_id, read_report(report_path) if report_path else None)
    files = files_to_push(heads_dir)
    if report_path:
        files[REPORT_NAME] = report_path
    api = HfApi(endpoint=endpoint, token=token)
    ops = [CommitOperationAdd(path_in_repo=k, path_or_fileobj=str(v)) for k, v in files.items()]
    ops.append(CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=str(card).encode()))
    try:
        api.create_repo(repo_id, private=private or None, exist_ok=True)  # None: the owner's default
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations=ops,
            commit_message=commit_message or f"Upload {conf['kind']} drafter with draftheads",
            revision=revision,
        )
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        hint = (
            "check your token (hf auth login or HF_TOKEN)"
            if status in (401, 403)
            else "check the repo id and network"
        )
        raise UserError(f"push to {repo_id} failed (HTTP {status or '?'}); {hint}") from None
    except OfflineModeIsEnabled:
        raise UserError(f"push to {repo_id}: HF_HUB_OFFLINE is set; unset it to publish") from None
    except (OSError, httpx2.HTTPError) as e:
        raise UserError(f"push to {repo_id} failed ({type(e).__name__}); check the network") from None
    return str(info.commit_url)
