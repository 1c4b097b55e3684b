"""``draftheads info``: what a checkpoint holds.

A draftheads checkpoint is read without its target. An engine's or a reference trainer's layout
(a vLLM, SGLang or speculators export, or a directory in a kind's official layout) says its shapes
only against a target, so it is imported onto ``target=`` (the default target unless named)
exactly as ``Drafter.from_pretrained`` would, and reported as the drafter it becomes.
"""

from __future__ import annotations

import json

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.heads.base import Drafter
from draftheads.heads.checkpoint import (
    WEIGHTS_NAME,
    load_checkpoint,
    read_config,
    read_weights,
    resolve_checkpoint_dir,
)
from draftheads.heads.convert.official import detect_layout
from draftheads.heads.layouts import OfficialCheckpoint
from draftheads.heads.target.load import load_target


def info(cfg: Config) -> None:
    """Print a checkpoint's kind, shapes and target fingerprint (``heads=DIR`` or a hub id).

    The checkpoint is built and loaded first, so a config.json that disagrees with the weights,
    or weights with NaN/inf, are refused (one line, exit 1) instead of reported.
    """
    if not cfg.heads:
        raise UserError("draftheads info needs heads=DIR (a checkpoint directory or a hub id)")
    directory = resolve_checkpoint_dir(cfg.heads, cfg.revision)
    official = detect_layout(directory)
    if official is not None:
        return official_info(official, cfg)
    load_checkpoint(directory)
    conf = read_config(directory)
    tensors = read_weights(directory)
    n_params = sum(t.numel() for t in tensors.values())
    spec = {k: v for k, v in conf["spec"].items() if k != "target_config"}
    print(f"checkpoint: {directory}")
    print(
        f"kind: {conf['kind']}  (format {conf.get('format_version')}, draftheads {conf.get('draftheads_version')})"
    )
    print(f"spec: {json.dumps(spec)}")
    print(f"target: {json.dumps(conf.get('target'))}")
    print(f"requires adapters: {bool(conf.get('requires_adapters'))}")
    print(f"{WEIGHTS_NAME}: {len(tensors)} tensors, {n_params:,} values")
    for name, t in sorted(tensors.items()):
        print(f"  {name:<60} {str(tuple(t.shape)):<18} {str(t.dtype).replace('torch.', '')}")
    if conf.get("provenance"):
        print(f"provenance: {json.dumps(conf['provenance'])}")


def official_info(ckpt: OfficialCheckpoint, cfg: Config) -> None:
    """Import ``ckpt`` onto ``cfg.target`` and print the drafter it becomes (refused in one line,
    as loading it would be, when it does not fit that target)."""
    target, tok = load_target(cfg.target)
    drafter = Drafter.from_pretrained(ckpt.directory, target=target, tokenizer=tok)
    conf = drafter.config_dict()
    tensors = drafter.state_dict()
    spec = {k: v for k, v in conf["spec"].items() if k != "target_config"}
    print(f"checkpoint: {ckpt.where()}")
    print(f"imported onto target {cfg.target.name_or_path} as kind: {conf['kind']}")
    print(f"spec: {json.dumps(spec)}")
    print(f"target: {json.dumps(conf.get('target'))}")
    print(f"trained tensors: {len(tensors)}, {sum(t.numel() for t in tensors.values()):,} values")
    for name, t in sorted(tensors.items()):
        print(f"  {name:<60} {str(tuple(t.shape)):<18} {str(t.dtype).replace('torch.', '')}")
