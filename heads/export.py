"""``draftheads export heads=DIR format=vllm|sglang|speculators out=DIR``: write a drafter for serving.

``format=speculators`` writes vLLM's ``speculators`` layout (:mod:`draftheads.heads.speculators`),
built from the vLLM layout below and served with ``vllm serve DIR`` alone.

What each engine's loader reads, and the rules it imposes, are in :mod:`draftheads.heads.engine.loaders`
(the spec table :data:`~draftheads.heads.engine.loaders.FORMATS` and the rule list
:data:`~draftheads.heads.engine.loaders.RULES`, each rule with the engine file it comes from). Every
export is validated against them before it is reported done.

Each kind writes its engine layouts in its own folder (``heads/<kind>/export.py``, whose docstring
gives the config, the tensor names and how the target layer ids map to each engine's convention:
our ``feature_layers`` index HF ``hidden_states``, the *input* of layer i, where an engine may
name layer *outputs*); this module asks the kind (``DrafterKind.export``, ``to_speculators``) and
writes the files.

The output directory must be new, empty, or a previous export (it holds ``export.json``);
a directory holding a drafter checkpoint, such as the drafter's own, is refused before anything
is written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from draftheads.conf.errors import UserError
from draftheads.heads.base import Drafter
from draftheads.heads.card import num_speculative_tokens, serve_command
from draftheads.heads.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    holds_checkpoint,
    package_version,
    read_config,
    resolve_checkpoint_dir,
)
from draftheads.heads.convert.official import detect_layout
from draftheads.heads.engine.loaders import ENGINES, FORMATS, RULES, validate_export
from draftheads.heads.files import atomic_write
from draftheads.heads.kinds import drafter_kind
from draftheads.heads.speculators import check_verifier_folder, speculators_section
from draftheads.heads.target.load import load_target

__all__ = ["ENGINES", "FORMATS", "RULES", "export", "export_drafter", "validate_export"]

SPECULATORS = "speculators"
FORMAT_NAMES = (*ENGINES, SPECULATORS)
EXPORT_RECORD = "export.json"  # marks a directory draftheads exported into (it may be rewritten)


def check_out_dir(out: Path, source: Path | None = None, engine: str | None = None) -> None:
    """Refuse, before anything is written, an ``out`` that would overwrite a drafter or is unusable.

    Allowed: a new path, an empty directory, or a previous export (it holds ``export.json``)
    of ``source`` in the same ``engine`` format (one in another format would be lost).
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"out={out} is an existing file; pass a new or empty directory")
    if source is not None and out.resolve() == source.resolve():
        raise UserError(
            f"out={out} is the drafter's own directory; exporting there would replace its config.json, "
            "pass another directory (e.g. out=exports/NAME)"
        )
    if holds_checkpoint(out) and not (out / EXPORT_RECORD).is_file():
        raise UserError(
            f"out={out} already holds a drafter checkpoint; export into a new or empty directory, never over one"
        )
    earlier = exported_from(out)
    if earlier and source is not None and Path(earlier).resolve() != source.resolve():
        raise UserError(
            f"out_dir={out} holds the export of another drafter (heads={earlier}, see its {EXPORT_RECORD}); "
            f"export heads={source} into another directory, or delete that export first"
        )
    earlier_engine = export_record(out).get("engine")
    if engine is not None and earlier_engine and str(earlier_engine).lower() != engine.lower():
        raise UserError(
            f"out_dir={out} holds the format={earlier_engine} export (see its {EXPORT_RECORD}), which "
            f"format={engine} would replace; export into another directory (e.g. out_dir={out}-{engine})"
        )
    parent = next((p for p in (out, *out.parents) if p.exists()), None)
    try:  # os.access says yes to root even on /proc: try it
        if parent is None:
            raise OSError("no existing parent")
        Path(tempfile.mkdtemp(prefix=".draftheads-probe-", dir=parent)).rmdir()
    except OSError:
        raise UserError(f"out={out}: {parent} is not writable; pass a directory you can write to") from None


def export_record(out: Path) -> dict[str, Any]:
    """The ``export.json`` of an earlier export in ``out`` (empty when there is none or it is unreadable)."""
    try:
        record = json.loads((out / EXPORT_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def exported_from(out: Path) -> str:
    """The drafter directory an earlier export in ``out`` was written from ("" when unknown)."""
    return str(export_record(out).get("source") or "")


def export_drafter(
    drafter: Drafter,
    engine: str,
    out: str | os.PathLike,
    source: Path | None = None,
    verifier: str | None = None,
    tokens: int | None = None,
) -> Path:
    """Write ``drafter`` for ``engine`` into ``out`` (config.json + model.safetensors) and validate it.

    A drafter whose export writes some of the target's weights (``DrafterKind.export_needs_target``)
    must be attached to its target.
    ``source`` (the drafter's directory) is never written to. ``verifier`` (speculators only) is
    the local folder of the target the export is served with, recorded instead of its Hub name;
    ``tokens`` (speculators only) the chain it proposes, instead of the model card's.
    """
    engine = engine.lower()
    if engine not in FORMAT_NAMES:
        raise UserError(f"format={engine} is not supported; use one of {', '.join(FORMAT_NAMES)}")
    out = Path(out)
    check_out_dir(out, source if source is not None else drafter.source_dir, engine)
    if engine == SPECULATORS:
        cfg, sd = export_speculators(drafter, verifier, tokens)
    else:
        cfg, sd = drafter_kind(drafter.kind).export(drafter, engine)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"out={out}: cannot create it ({e.strerror}); pass a directory you can write to"
        ) from None
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sd.items()}
    atomic_write(out / WEIGHTS_NAME, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    atomic_write(out / CONFIG_NAME, lambda p: p.write_text(json.dumps(cfg, indent=2) + "\n"))
    record = {"draftheads_version": package_version(), "engine": engine, "source": str(source or "")}
    atomic_write(out / EXPORT_RECORD, lambda p: p.write_text(json.dumps(record, indent=2) + "\n"))
    if engine != SPECULATORS:
        validate_export(out, engine, drafter.target_fingerprint.num_layers)
    return out


def export_speculators(
    drafter: Drafter, verifier: str | None = None, tokens: int | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The drafter in speculators' layout, as its kind writes it (``DrafterKind.to_speculators``).

    The verifier is the drafter's target; the default proposal is the greedy chain of ``tokens``
    drafts, else the one the model card names (:func:`~draftheads.heads.card.num_speculative_tokens`).
    A drafter speculators has no type for is refused (``DrafterKind.speculators_refusal``).
    ``verifier`` (a local copy of the target, checked to be it) replaces the target's name.
    """
    kind, conf = drafter_kind(drafter.kind), drafter.kind_config()
    refusal = kind.speculators_refusal(conf)
    if refusal:
        raise UserError(refusal)
    fp = drafter.target_fingerprint
    k = tokens or num_speculative_tokens(conf)
    name = check_verifier_folder(verifier, fp) if verifier else fp.name
    section = speculators_section(kind.speculators_type or "", k, name, fp.architecture)
    return kind.to_speculators(drafter, section)


def needs_target(directory: Path) -> bool:
    """Official layouts (imported for a target), and drafters whose export writes some of the
    target's weights (``DrafterKind.export_needs_target``: say its lm_head, or rows of it)."""
    if detect_layout(directory) is not None:
        return True
    conf = read_config(directory)
    return drafter_kind(conf["kind"], f"{directory}: drafter kind").export_needs_target(conf)


def check_engine_fits(directory: Path, engine: str) -> None:
    """Refuse, before the target is loaded, a draftheads checkpoint the engine cannot serve."""
    if detect_layout(directory) is not None:
        return
    conf = read_config(directory)
    refusal = drafter_kind(conf["kind"], f"{directory}: drafter kind").export_refusal(conf, engine)
    if refusal:
        raise UserError(refusal)


def export(cfg) -> Path:
    """CLI entry: ``draftheads export heads=DIR format=vllm|sglang|speculators out=DIR [target=...]``."""
    if not cfg.heads or not cfg.format or not cfg.out:
        raise UserError("draftheads export needs heads=DIR format=vllm|sglang|speculators out=DIR")
    engine = cfg.format.lower()
    if engine not in FORMAT_NAMES:
        raise UserError(f"format={cfg.format} is not supported; use one of {', '.join(FORMAT_NAMES)}")
    directory = resolve_checkpoint_dir(cfg.heads, cfg.revision)
    check_out_dir(Path(cfg.out), directory, engine)  # before loading anything
    check_engine_fits(directory, engine)
    verifier = getattr(cfg, "verifier", None)
    if verifier and not Path(verifier).expanduser().is_dir():  # before loading anything
        raise UserError(
            f"verifier={verifier} does not exist; pass the folder of the target model the engine serves"
        )
    if needs_target(directory):
        target, tok = load_target(cfg.target)
        drafter = Drafter.from_pretrained(directory, target=target, tokenizer=tok)
    else:
        drafter = Drafter.from_pretrained(directory)
    if verifier and engine != SPECULATORS:  # the target named in the printed serve command
        verifier = check_verifier_folder(verifier, drafter.target_fingerprint)
    out = export_drafter(drafter, engine, cfg.out, source=directory, verifier=verifier)
    note = vllm_cpu_note(drafter) if engine != "sglang" else None
    if engine == SPECULATORS:
        print(f"exported {drafter.kind} drafter to {out} (speculators); serve it with:")
        print(f"  vllm serve {out}")
        if not verifier:
            print(
                f"  (vLLM loads the verifier {drafter.target_fingerprint.name} by that name; to serve a local "
                "copy, export again with verifier=PATH)"
            )
        if note:
            print(note)
        return out
    fmt = validate_export(out, engine, drafter.target_fingerprint.num_layers)
    if drafter.requires_adapters:
        short = drafter_kind(drafter.kind).describe_short(drafter.kind_config())
        print(
            f"note: this drafter ({short}) was trained with LoRA adapters on the target; serve it with the "
            "target with those adapters merged (peft merge_and_unload), never with the plain target"
        )
    print(f"exported {drafter.kind} drafter to {out} ({engine} {fmt.method}); serve it with:")
    print("  " + serve_line(drafter, engine, out, verifier))
    if note:
        print(note)
    return out


def serve_line(
    drafter: Drafter, engine: str, out: Path, verifier: str | None = None, tokens: int | None = None
) -> str:
    """The command that serves ``drafter``'s export in ``out`` with ``engine``: a speculators
    export alone (it names its verifier and chain), else the target (``verifier``, a local folder,
    or the target's name) with ``tokens`` drafted per step (default: the model card's)."""
    if engine == SPECULATORS:
        return f"vllm serve {out}"
    fmt = validate_export(out, engine, drafter.target_fingerprint.num_layers)
    target_name = verifier or drafter.target_fingerprint.name
    if drafter.requires_adapters:
        target_name = "MERGED_TARGET"
    k = tokens or num_speculative_tokens(drafter.kind_config())
    return serve_command(engine, fmt.method, target_name, str(out), k, fmt.serve_flags)


VLLM_CPU_MIN_HEAD = 32  # vLLM's CPU attention kernels take no smaller head size


def vllm_cpu_note(drafter: Drafter) -> str | None:
    """A note, before any engine starts, when vLLM's CPU build cannot serve this drafter (its
    attention's head size, the target's, is below what vLLM's CPU attention accepts)."""
    layers = getattr(drafter, "layer_config", None)
    head = getattr(layers, "head_dim", None)
    if isinstance(head, int) and head < VLLM_CPU_MIN_HEAD:
        return (
            f"note: the attention head size is {head}; vLLM's CPU build needs at least {VLLM_CPU_MIN_HEAD}, "
            "so serve this export with vLLM on a GPU"
        )
    return None
