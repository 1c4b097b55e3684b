"""Atomic, integrity-checked training checkpoints under ``output_dir/checkpoints/step-NNNNNNN``.

A checkpoint is DeepSpeed's own (module, optimizer, scheduler, engine counters; frozen
parameters excluded) plus each rank's RNG state and the drafter as a loadable
``config.json`` + ``model.safetensors``. Every rank writes into
``checkpoints/.partial-step-N/``; after a barrier rank 0 records every file's size and SHA-256
in ``manifest.json``, renames the finished folder to ``step-N`` (one atomic rename) and only
then updates ``latest``. A run killed mid-write leaves a ``.partial-*`` folder that nothing
ever loads, and that the next start removes. Resuming picks the newest checkpoint whose files
all match its manifest, saying which damaged ones it skipped.

Nothing is unpickled with code execution: RNG state is tensors in safetensors with JSON
metadata, and DeepSpeed's ``*.pt`` files are read with ``torch.load(weights_only=True)``,
which admits tensors, containers and primitive values only (plus the DeepSpeed record
classes in :data:`DEEPSPEED_SAFE_GLOBALS`, rebuilt from their fields without running code).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from draftheads.conf.errors import UserError
from draftheads.conf.schema.flat_keys import nested_draft
from draftheads.heads.files import follow_umask

PREFIX = "step-"
MANIFEST = "manifest.json"


def step_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first (partial writes never carry the ``step-`` name)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def remove_partials(root: Path) -> None:
    if root.is_dir():
        for p in root.glob(".partial-*"):
            shutil.rmtree(p, ignore_errors=True)


# ---- integrity -------------------------------------------------------------------------
def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """``manifest.json``: size and SHA-256 of every file of the checkpoint folder."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": file_digest(p)} for p in files
    }
    (folder / MANIFEST).write_text(json.dumps({"files": entries}, indent=1))


def damage(folder: Path) -> str | None:
    """Why ``folder`` is not an intact checkpoint (a missing, resized or altered file), or None."""
    try:
        entries = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable {MANIFEST}"
    for name, meta in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != meta["bytes"] or file_digest(path) != meta["sha256"]:
            return f"{name} does not match its recorded checksum"
    return None


def intact_checkpoint(root: Path, log: Callable[[str], None] | None = None) -> Path | None:
    """The newest intact checkpoint under ``root``; damaged newer ones are named in one line.

    Raises :class:`UserError` when checkpoints exist but none is intact.
    """
    found = complete_checkpoints(root)
    skipped: list[str] = []
    for ckpt in reversed(found):
        why = damage(ckpt)
        if why is None:
            if skipped:
                (log or _stderr)(
                    f"skipping damaged checkpoint(s) {'; '.join(skipped)}; resuming from {ckpt.name}"
                )
            return ckpt
        skipped.append(f"{ckpt.name} ({why})")
    if found:
        raise UserError(
            f"no intact checkpoint under {root}: {'; '.join(skipped)}; "
            "pass train.resume=none with a new train.out_dir to start fresh"
        )
    return None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


# ---- RNG state, without pickle ---------------------------------------------------------
def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])


def save_rng(state: dict[str, Any], path: Path) -> None:
    """RNG state as safetensors: torch/cuda byte tensors, Python's Mersenne state as int64;
    the Python state's version and gauss value go into the JSON metadata."""
    version, words, gauss = state["python"]
    tensors = {"torch": state["torch"], "python": torch.tensor(words, dtype=torch.int64)}
    tensors.update({f"cuda{i}": s for i, s in enumerate(state["cuda"])})
    save_file(tensors, str(path), metadata={"python": json.dumps({"version": version, "gauss": gauss})})
    follow_umask(path)


def load_rng(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["python"])
    t = load_file(str(path))
    cuda = [t[f"cuda{i}"] for i in range(sum(k.startswith("cuda") for k in t))]
    words = tuple(int(w) for w in t["python"].tolist())
    return {"torch": t["torch"], "cuda": cuda, "python": (meta["version"], words, meta["gauss"])}


def rng_file(folder: Path, rank: int) -> Path:
    return folder / f"rng-rank{rank}.safetensors"


# ---- DeepSpeed files, loaded with weights_only=True -------------------------------------
def deepspeed_safe_globals() -> list:
    """DeepSpeed's plain record classes that its ZeRO optimizer states hold; the weights-only
    unpickler rebuilds them from their fields, it never calls their code."""
    out: list = []
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler

        out += [LossScaler, DynamicLossScaler]
    except ImportError:
        pass
    try:
        from deepspeed.utils.tensor_fragment import fragment_address

        out.append(fragment_address)
    except ImportError:
        pass
    try:
        from deepspeed.runtime.zero.config import ZeroStageEnum

        out.append(ZeroStageEnum)
    except ImportError:
        pass
    return out


def use_weights_only_loader(engine) -> None:
    """Make every DeepSpeed checkpoint read of ``engine`` a ``torch.load(weights_only=True)``."""
    globals_ = deepspeed_safe_globals()

    def load(path: str, map_location=None):
        with torch.serialization.safe_globals(globals_):
            return torch.load(path, map_location=map_location, weights_only=True)

    engine.checkpoint_engine.load = load


def save(engine, root: Path, step: int, rank: int, export_drafter, rng: dict | None = None) -> Path:
    """Write checkpoint ``step`` atomically; ``export_drafter(dir)`` writes the loadable drafter.

    ``rng`` is the RNG state to record (default: now); an interrupted step passes the state
    from that step's start, so the resumed run redraws exactly what the step would have.
    """
    name = step_name(step)
    partial = root / f".partial-{name}"
    engine.save_checkpoint(
        str(partial), tag=name, client_state={"step": step}, save_latest=False, exclude_frozen_parameters=True
    )
    (partial / name).mkdir(parents=True, exist_ok=True)
    save_rng(rng or rng_state(), rng_file(partial / name, rank))
    export_drafter(partial / name / "drafter")  # collective under ZeRO-3; rank 0 writes
    dist.barrier()
    final = root / name
    if rank == 0:
        write_manifest(partial / name)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial / name, final)
        shutil.rmtree(partial, ignore_errors=True)
        tmp = root / f".latest.tmp{os.getpid()}"
        tmp.write_text(name + "\n")
        os.replace(tmp, root / "latest")
    dist.barrier()
    return final


def prune(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (0 keeps all)."""
    if keep > 0:
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def load(engine, ckpt: Path, rank: int) -> int:
    """Restore engine, optimizer, scheduler and this rank's RNG; returns the step to continue from."""
    use_weights_only_loader(engine)
    try:
        _, client = engine.load_checkpoint(
            str(ckpt.parent),
            tag=ckpt.name,
            load_module_strict=False,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
    except (RuntimeError, OSError, ValueError, pickle.UnpicklingError) as e:
        raise Unreadable(ckpt, load_failure(e)) from None
    if client is None:
        raise Unreadable(ckpt, "DeepSpeed found no state in it")
    rng = rng_file(ckpt, rank)
    if rng.is_file():
        try:
            set_rng_state(load_rng(rng))
        except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as e:
            raise Unreadable(ckpt, f"{rng.name}: {load_failure(e)}") from None
    return int(client["step"])


# What works when a checkpoint cannot be read: train.resume=none is refused while checkpoints exist.
UNREADABLE_FIX = (
    "move that checkpoint out of checkpoints/ to resume from the one before it (train.resume=auto), "
    "or start fresh with another train.out_dir"
)


class Unreadable(UserError):
    """A checkpoint whose files match their manifest but do not load; ``reason`` says why."""

    def __init__(self, ckpt: Path, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{ckpt} is not a readable training checkpoint ({reason}); {UNREADABLE_FIX}")


def load_failure(e: BaseException) -> str:
    """Why a checkpoint file did not load, in a few whole words: a pickle the weights-only loader
    refuses is named as such, anything else by its first sentence (at most about 120 characters)."""
    text = str(e).strip()
    if isinstance(e, pickle.UnpicklingError) or "Weights only load failed" in text:
        return "it holds pickled objects other than tensors, which are never unpickled"
    first = text.splitlines()[0].split(". ")[0] if text else type(e).__name__
    return first if len(first) <= 120 else first[:120].rsplit(" ", 1)[0] + " ..."


def older_intact(root: Path, than: Path) -> list[Path]:
    """The intact checkpoints under ``root`` older than ``than``, newest first."""
    step = int(than.name[len(PREFIX) :])
    return [
        c
        for c in reversed(complete_checkpoints(root))
        if int(c.name[len(PREFIX) :]) < step and damage(c) is None
    ]


def load_readable(
    engine, ckpt: Path, rank: int, fallback: bool, check: Callable[[Path], None] = lambda _: None
) -> tuple[Path, int]:
    """:func:`load` ``ckpt``; when it cannot be read and ``fallback`` (``train.resume=auto``), the
    newest older intact checkpoint that ``check`` accepts and that loads, as for other damage
    (each skipped one named on stderr). Returns the checkpoint loaded and its step."""
    tried: list[str] = []
    candidates = [ckpt, *(older_intact(ckpt.parent, ckpt) if fallback else [])]
    for i, candidate in enumerate(candidates):
        try:
            if i > 0:
                check(candidate)
            step = load(engine, candidate, rank)
        except UserError as e:
            if not fallback:
                raise
            tried.append(f"{candidate.name} ({getattr(e, 'reason', e)})")
            continue
        if tried:
            _stderr(f"skipping unreadable checkpoint(s) {'; '.join(tried)}; resuming from {candidate.name}")
        return candidate, step
    raise UserError(
        f"no readable checkpoint under {ckpt.parent}: {'; '.join(tried)}; start fresh with another train.out_dir"
    )


# What a resumed run must share with the run that wrote the checkpoint for its steps to continue
# that run: everything that shapes the drafter, the data, their order and the optimizer. Keys not
# listed (output and logging cadence, stop_at, max_steps to extend a run) may change.
RESUME_SECTIONS = ("target", "draft", "data", "deepspeed")
RESUME_TRAIN_KEYS = (
    "lr", "weight_decay", "betas", "lr_schedule", "warmup_steps", "warmup_ratio", "micro_batch_size", "grad_accum",
    "grad_clip", "precision", "seed", "features", "feature_cache", "rows", "eval_rows",
)  # fmt: skip
# where the target runs, and data settings that only other commands read
RESUME_FREE_KEYS = ("target.device", "target.cache_dir", "data.distill.", "data.features.", "data.show")


def config_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first config key (dotted) whose value differs between a checkpoint's run and this one."""

    def flat(d: Any, prefix: str) -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix: d}
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}"))
        return out or {prefix: d}

    keys = [*RESUME_SECTIONS, *(f"train.{k}" for k in RESUME_TRAIN_KEYS)]
    # a run of the last release saved its draft keys flat
    saved, current = (
        {**c, "draft": nested_draft(c["draft"])} if isinstance(c.get("draft"), dict) else c
        for c in (saved, current)
    )
    a, b = {}, {}
    for key in keys:
        section, _, sub = key.partition(".")
        a.update(flat(saved.get(section, {}).get(sub) if sub else saved.get(section), key))
        b.update(flat(current.get(section, {}).get(sub) if sub else current.get(section), key))
    for key in sorted(set(a) | set(b)):
        if key.startswith(RESUME_FREE_KEYS):
            continue
        if a.get(key) != b.get(key):
            return f"{key}={a.get(key)!r} in the checkpoint, {b.get(key)!r} now"
    return None


def saved_config(ckpt: Path) -> dict[str, Any] | None:
    """The run config recorded in a checkpoint's drafter (``provenance.config``), if readable."""
    try:
        meta = json.loads((ckpt / "drafter" / "config.json").read_text())
        return meta["provenance"]["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
