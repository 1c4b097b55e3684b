"""Where a command may write, and who writes there: one guard and one lock for every output folder.

:func:`guard_out_dir` is the one rule every command that writes applies before any work: an
output folder is refused when it is empty-named (``train.out_dir=`` left blank would mean the
working directory), a file, unwritable, inside a training run (``<run>/checkpoints/...``, whose
files the run prunes and checksums), or non-empty without draftheads output of that command's
kind (:data:`MARKERS`), so no command ever replaces files it did not write. A folder of the
same kind is accepted: that is how a command resumes or refreshes its own output.

:func:`claim_out_dir` applies the guard, creates the folder and takes its lock: a file
``.draftheads.lock`` created with ``O_EXCL`` and holding the writer's pid. A second process
that wants the folder is refused in one line while the first runs (two ``train`` runs would
interleave ``metrics.jsonl``, two ``distill`` runs would write every row twice); a lock left by
a process that no longer runs is taken over with a note. Locks are re-entrant within a process
and released at exit (or by :func:`release_out_dir`); a folder the claim created and nothing
filled is removed again, so a command stopped by an error leaves nothing behind.

Nothing here imports torch: the command line checks folders before any model loads.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds import BUILTIN_KINDS

LOCK = ".draftheads.lock"
# An unreadable lock this old is a writer that died between creating and filling it.
EMPTY_LOCK_GRACE_S = 10.0


def read_json(path: Path) -> dict[str, Any] | None:
    """``path`` as a JSON object, or None when it is absent or not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_drafter(folder: Path) -> bool:
    """A drafter checkpoint draftheads saved: ``config.json`` with its format keys."""
    conf = read_json(folder / "config.json") or {}
    return "draftheads_version" in conf and "kind" in conf


def is_training_run(folder: Path) -> bool:
    """What ``draftheads train`` writes: metrics, the finished drafter, or checkpoints (a
    ``checkpoints/`` folder with ``latest``, a ``step-N`` or a half-written ``.partial-step-N``)."""
    ckpts = folder / "checkpoints"
    saved = ckpts.is_dir() and any(any(ckpts.glob(g)) for g in ("latest", "step-*", ".partial-*"))
    return saved or (folder / "metrics.jsonl").is_file() or is_drafter(folder)


def is_tree_record(path: Path) -> bool:
    """A ``tree.json`` that ``draftheads tree`` wrote (its measured expectation is recorded)."""
    record = read_json(path) or {}
    return "choices" in record and "expected_tau" in record


# The stage folders ``draftheads bench`` writes under ``bench.out_dir`` (bench/pipeline.py, study.py).
# The drafters' folders are their kinds' (one per bench row, declared in each kind's record).
BENCH_FOLDERS = (
    "distill",
    "teacher",
    "features",
    "mixture",
    *(folder for kind in BUILTIN_KINDS for folder in kind.folders),
    "scaling",
    "ablations",
)

# Per command kind: (what its output is called, whether a folder holds it).
MARKERS: dict[str, tuple[str, Callable[[Path], bool]]] = {
    "train": ("a draftheads training run", is_training_run),
    "distill": (
        "a draftheads distillation",
        lambda p: any((p / n).is_file() for n in ("distill.json", "prompts.jsonl", "prompts.stats.json")),
    ),
    "features": ("a draftheads feature cache", lambda p: "layers" in (read_json(p / "manifest.json") or {})),
    "export": ("a draftheads export", lambda p: (p / "export.json").is_file()),
    "eval": ("a draftheads eval report", lambda p: "tau" in (read_json(p / "report.json") or {})),
    "tree": ("a draftheads tree or drafter", lambda p: is_tree_record(p / "tree.json") or is_drafter(p)),
    "data": (
        "a data set draftheads data saved",
        lambda p: (p / "state.json").is_file() and (p / "dataset_info.json").is_file(),
    ),
    "bench": (
        "a draftheads bench",
        lambda p: (p / "results.json").is_file() or any((p / n).is_dir() for n in BENCH_FOLDERS),
    ),
    # a folder that receives one named file (``tree out_dir=FILE.json``, ``bench.docs``): adding a
    # file replaces nothing, so any folder may; the command checks the file itself
    "file": ("a folder", lambda p: True),
}


def nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def writable_dir(path: str | os.PathLike, key: str) -> Path:
    """Refuse an output directory that is a file or cannot be created or written; returns it.

    Probed by creating (and removing) a temporary directory in the closest existing ancestor,
    so the answer is the file system's own, also for root and for pseudo file systems.
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"{key}={path} is an existing file, not a directory; choose a directory path")
    base = nearest_existing(out)
    if not base.is_dir():
        raise UserError(
            f"{key}={path}: {base} is a file, so the directory cannot be created; choose another path"
        )
    try:
        tempfile.TemporaryDirectory(dir=base, prefix=".draftheads-probe-").cleanup()
    except OSError as e:
        raise UserError(
            f"{key}={path} cannot be written ({e.strerror or e}); choose a writable directory"
        ) from None
    return out


def training_run_around(path: Path) -> Path | None:
    """The training run whose ``checkpoints/`` folder holds ``path`` (or is it), if any."""
    for p in (path, *path.parents):
        if p.name == "checkpoints" and is_training_run(p.parent):
            return p.parent
    return None


def contents(folder: Path) -> list[str]:
    """The names in ``folder`` other than its lock, sorted."""
    return sorted(p.name for p in folder.iterdir() if p.name != LOCK) if folder.is_dir() else []


def guard_out_dir(path: str | os.PathLike | None, kind: str, key: str) -> Path:
    """Refuse an output folder command ``kind`` must not write into (see the module doc); returns it.

    Changes nothing on disk. ``key`` is the setting as the user spells it (``train.out_dir``).
    """
    example = "outputs" if kind == "file" else f"outputs/{kind}"
    if path is None or not str(path).strip():
        raise UserError(f"{key} is empty; give the folder to write to (e.g. {key}={example})")
    out = Path(path).expanduser()
    run = training_run_around(out.resolve())
    if run is not None:
        raise UserError(
            f"{key}={path} is inside the training run {run}, whose checkpoints it would mix with; "
            f"choose a folder outside it (e.g. {key}={example})"
        )
    writable_dir(out, key)
    what, holds = MARKERS[kind]
    found = contents(out)
    if found and not holds(out):
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        other = "a drafter checkpoint or training run" if is_training_run(out) else f"other files ({shown})"
        raise UserError(
            f"{key}={path} holds {other}, not {what}; nothing there is replaced: choose a new or empty "
            f"folder (e.g. {key}={out / kind})"
        )
    return out


# ---- the lock ------------------------------------------------------------------------------
# folders this process holds -> the topmost folder its claim created (removed again if left empty)
_held: dict[Path, Path | None] = {}


def lock_holder(lock: Path) -> int | None:
    """The pid written in ``lock``; None while it is unreadable (being written, or torn)."""
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's process counts)."""
    if pid == os.getpid():
        return False  # not ours (we hold no such lock): a dead process whose pid was reused by us
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(lock: Path, pid: int | None) -> bool:
    """A lock whose process is gone (or that stayed unreadable past :data:`EMPTY_LOCK_GRACE_S`)."""
    if pid is not None:
        return not is_running(pid)
    try:
        return time.time() - lock.stat().st_mtime > EMPTY_LOCK_GRACE_S
    except FileNotFoundError:
        return True


def make_dirs(out: Path) -> Path | None:
    """Create ``out`` and its missing parents; returns the topmost folder created (None: it existed)."""
    top = None
    for p in reversed((out, *out.parents)):
        if not p.exists():
            top = top or p
    out.mkdir(parents=True, exist_ok=True)
    return top


def take_lock(out: Path, key: str) -> None:
    """Create ``out/.draftheads.lock`` holding this pid, taking over a stale one with a note."""
    lock = out / LOCK
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pid = lock_holder(lock)
            if not is_stale(lock, pid):
                raise UserError(
                    f"{key}={out} is in use by another draftheads process (pid {pid or '?'}, lock {lock}); "
                    f"wait for it to finish or choose another {key} (remove the lock only if no such process runs)"
                ) from None
            print(
                f"note: {key}={out}: taking over the lock of process {pid or '?'}, which is no longer running",
                file=sys.stderr,
            )
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return
    raise UserError(f"{key}={out}: another process keeps taking its lock; choose another {key}")


def claim_out_dir(path: str | os.PathLike | None, kind: str, key: str) -> Path:
    """:func:`guard_out_dir`, then create the folder and lock it for this process; returns it.

    Claiming a folder this process already holds is a no-op (a resumed call, a bench stage).
    """
    out = guard_out_dir(path, kind, key)
    real = out.resolve()
    if real in _held:
        return out
    created = make_dirs(real)
    try:
        take_lock(real, key)
    except BaseException:
        remove_empty(real, created)
        raise
    _held[real] = created
    return out


def remove_empty(out: Path, created: Path | None) -> None:
    """Remove ``out`` and its parents up to ``created`` while they are empty (what a claim made)."""
    if created is None:
        return
    for p in (out, *out.parents):
        try:
            p.rmdir()
        except OSError:
            return
        if p == created:
            return


def release_out_dir(path: str | os.PathLike) -> None:
    """Give up this process's lock on ``path`` (a no-op when it holds none)."""
    real = Path(path).expanduser().resolve()
    if real not in _held:
        return
    created = _held.pop(real)
    lock = real / LOCK
    if lock_holder(lock) == os.getpid():
        lock.unlink(missing_ok=True)
    remove_empty(real, created)


@contextmanager
def claimed(path: str | os.PathLike | None, kind: str, key: str) -> Iterator[Path]:
    """:func:`claim_out_dir` for the duration of a block (kept if the process held it before)."""
    held = path is not None and Path(path).expanduser().resolve() in _held
    out = claim_out_dir(path, kind, key)
    try:
        yield out
    finally:
        if not held:
            release_out_dir(out)


@atexit.register
def release_all() -> None:
    """Release every lock this process still holds (at exit)."""
    for real in list(_held):
        release_out_dir(real)
