"""Import official Medusa and EAGLE checkpoints: detect the layout, map the keys, load strictly.

``Drafter.from_pretrained(dir_or_hub_id, target=model)`` calls :func:`import_official` when the
directory is not a draftheads checkpoint. Layouts (see ``shared/reference/medusa.md`` §2 and
``eagle.md`` §2):

==============  ===============================================  =====================================
layout          files                                            keys
==============  ===============================================  =====================================
``medusa-v1``   ``medusa_lm_head.safetensors`` or ``.pt``        ``{h}.{l}.linear.{weight,bias}``,
                                                                 ``{h}.{L}.weight`` (per-head lm_head)
``medusa-v2``   same                                             ``{h}.{l}.linear.*`` only
``medusa-2``    full HF checkpoint (``model*.safetensors`` /     ``medusa_head.{h}.…`` beside
                ``pytorch_model*.bin``)                          ``model.*`` and ``lm_head.weight``
``eagle-1``     ``pytorch_model.bin`` / ``model.safetensors``    ``fc.*``, ``layers.{i}.*``,
                                                                 optional ``embed_tokens.weight``
``eagle-3``     same                                             ``midlayer.*``, ``fc``, ``norm``,
                                                                 ``lm_head``, ``d2t``, ``t2d``
==============  ===============================================  =====================================

Why the target is required: official files carry no usable fingerprint (Medusa's config even
gets the head count wrong), so the drafter is built for the target the user loads it with,
every tensor's shape is checked against that target, and the fingerprint is taken from it.
Medusa head and layer counts come from the keys, never from the config. Pickles are read
with ``torch.load(weights_only=True)`` only.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.base import CONFIG_NAME, Drafter
from draftheads.heads.target import TargetFingerprint, fingerprint

log = logging.getLogger(__name__)

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
MEDUSA2_PREFIX = "medusa_head."
# Keys of an official EAGLE layer config that shape the drafter's own layers without touching
# the rotary embedding it shares with the target.
EAGLE_LAYER_KEYS = ("intermediate_size", "num_key_value_heads", "rms_norm_eps", "hidden_act")


@dataclass
class OfficialCheckpoint:
    """An official checkpoint found in ``directory``: its layout, weight files and raw config."""

    layout: str
    directory: Path
    files: list[Path]
    config: dict[str, Any] = field(default_factory=dict)

    def where(self) -> str:
        names = ", ".join(f.name for f in self.files[:2]) + ("…" if len(self.files) > 2 else "")
        return f"{self.directory} ({self.layout}: {names})"


# ---- reading -------------------------------------------------------------------------------
def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when absent, unreadable or not an object."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def weight_files(directory: Path) -> list[Path]:
    """The full-checkpoint weight files in ``directory``, safetensors first, sharded or not."""
    for index, single in ((SAFETENSORS_INDEX, "model.safetensors"), (PICKLE_INDEX, "pytorch_model.bin")):
        idx = read_json(directory / index)
        if idx and isinstance(idx.get("weight_map"), dict):
            names = sorted(set(idx["weight_map"].values()))
            missing = [n for n in names if not (directory / n).is_file()]
            if missing:
                raise UserError(
                    f"{directory / index} lists {missing[0]}, which is missing; the download is incomplete"
                )
            return [directory / n for n in names]
        if (directory / single).is_file():
            return [directory / single]
    return []


def _load_pickle(path: Path) -> dict[str, torch.Tensor]:
    """A pickled state dict, read with ``weights_only=True`` (no code runs), memory-mapped if possible."""
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) pickles cannot be memory-mapped
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling raises many types; all mean the same thing to the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"{path}: cannot read it as a weights-only torch checkpoint ({first}); it is corrupt or holds code"
        ) from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"{path} does not hold a plain state dict of tensors")
    return sd


def iter_tensors(
    files: list[Path], keep: Callable[[str], bool] = lambda k: True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(key, tensor)`` for the keys that ``keep`` accepts, one tensor at a time for safetensors."""
    for path in files:
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    for k in f.keys():
                        if keep(k):
                            yield k, f.get_tensor(k)
            except (SafetensorError, OSError) as e:
                raise UserError(f"{path} is truncated or corrupt ({e}); re-download it") from None
        else:
            for k, v in _load_pickle(path).items():
                if keep(k):
                    yield k, v


def list_keys(files: list[Path]) -> list[str]:
    """All tensor names in ``files`` (safetensors: from the header only)."""
    keys: list[str] = []
    for path in files:
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    keys.extend(f.keys())
            except (SafetensorError, OSError) as e:
                raise UserError(f"{path} is truncated or corrupt ({e}); re-download it") from None
        else:
            keys.extend(_load_pickle(path))
    return keys


def read_tensors(files: list[Path], keep: Callable[[str], bool] = lambda k: True) -> dict[str, torch.Tensor]:
    return dict(iter_tensors(files, keep))


# ---- detection -----------------------------------------------------------------------------
def classify_keys(keys: list[str]) -> str | None:
    """The official layout that a full checkpoint's tensor names imply, or None."""
    if any(k.startswith(MEDUSA2_PREFIX) for k in keys):
        return "medusa-2"
    if any(k.startswith("midlayer.") for k in keys):
        return "eagle-3"
    if "fc.weight" in keys and any(k.startswith("layers.0.") for k in keys):
        return "eagle-1"
    return None


def detect_layout(directory: Path) -> OfficialCheckpoint | None:
    """The official checkpoint in ``directory``; None for a draftheads checkpoint (or nothing to read).

    A ``config.json`` that is a draftheads config (it has ``kind``) or is not valid JSON is left to
    the draftheads loader, whose errors describe those cases.
    """
    cfg_path = directory / CONFIG_NAME
    config = read_json(cfg_path)
    if cfg_path.is_file() and (config is None or "kind" in config):
        return None
    config = config or {}
    for name in MEDUSA_FILES:
        if (directory / name).is_file():
            keys = list_keys([directory / name])
            version = "v1" if _medusa_has_lm_heads(keys) else "v2"
            return OfficialCheckpoint(f"medusa-{version}", directory, [directory / name], config)
    files = weight_files(directory)
    if not files:
        return None
    layout = classify_keys(list_keys(files))
    if layout is None:
        raise UserError(
            f"{directory}: neither a draftheads checkpoint (config.json with 'kind') nor an official Medusa "
            f"or EAGLE layout (medusa_lm_head.*, medusa_head.*, fc + layers.0.*, midlayer.*) in {files[0].name}"
        )
    return OfficialCheckpoint(layout, directory, files, config)


_MEDUSA_KEY = re.compile(r"^(\d+)\.(\d+)\.(?:(linear)\.)?(weight|bias)$")


def _medusa_has_lm_heads(keys: list[str]) -> bool:
    return any((m := _MEDUSA_KEY.match(k)) and m.group(3) is None for k in keys)


# ---- conversion ----------------------------------------------------------------------------
def medusa_spec(keys: list[str], where: str) -> tuple[int, int, str]:
    """(num_heads, num_layers, lm_head mode) inferred from Medusa-1 keys; strict about stray keys."""
    blocks: dict[int, set[int]] = {}
    heads_with_lm: dict[int, int] = {}
    for k in keys:
        m = _MEDUSA_KEY.match(k)
        if m is None:
            raise UserError(f"{where}: unexpected key {k!r}; not a Medusa head checkpoint")
        h, i, linear, what = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        if linear:
            blocks.setdefault(h, set()).add(i)
        elif what == "weight":
            heads_with_lm[h] = i
        else:
            raise UserError(f"{where}: unexpected key {k!r}; Medusa lm_heads have no bias")
    heads = sorted(set(blocks) | set(heads_with_lm))
    if not heads or heads != list(range(len(heads))):
        raise UserError(f"{where}: head indices {heads} are not 0..n-1; the checkpoint is incomplete")
    layer_sets = {h: sorted(blocks.get(h, set())) for h in heads}
    num_layers = len(layer_sets[0])
    if any(v != list(range(num_layers)) for v in layer_sets.values()):
        raise UserError(f"{where}: heads have different or gapped ResBlock layers {layer_sets}")
    if heads_with_lm and (
        sorted(heads_with_lm) != heads or any(i != num_layers for i in heads_with_lm.values())
    ):
        raise UserError(
            f"{where}: per-head lm_heads {heads_with_lm} do not follow the {num_layers} ResBlocks of every head"
        )
    return len(heads), num_layers, "copy" if heads_with_lm else "shared"


def medusa_tensors(sd: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Official Medusa keys -> ours: ``{h}.{l}.linear.*`` -> ``blocks.{h}.{l}.linear.*``, ``{h}.{L}`` -> ``lm_heads.{h}``."""
    out = {}
    for k, v in sd.items():
        h, i, rest = k.split(".", 2)
        if rest.startswith("linear."):
            out[f"blocks.{h}.{i}.{rest}"] = v
        else:
            out[f"lm_heads.{h}.{rest}"] = v
    return out


def eagle1_tensors(sd: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """Official EAGLE-1 keys are ours, minus the embedding copy; a bias-less ``fc`` gets a zero bias."""
    out = {k: v for k, v in sd.items() if k != "embed_tokens.weight"}
    if "fc.weight" in out and "fc.bias" not in out:
        out["fc.bias"] = torch.zeros(hidden, dtype=out["fc.weight"].dtype)
    return out


def eagle3_tensors(sd: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """Official EAGLE-3 keys -> ours: ``midlayer.hidden_norm`` -> ``hidden_norm``, ``midlayer.*`` -> ``layers.0.*``.

    A missing ``t2d`` (ModelOpt exports only ``d2t``) is rebuilt from ``d2t``.
    """
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == "embed_tokens.weight":
            continue
        if k == "midlayer.hidden_norm.weight":
            out["hidden_norm.weight"] = v
        elif k.startswith("midlayer."):
            out["layers.0." + k[len("midlayer.") :]] = v
        else:
            out[k] = v
    if "d2t" in out and "t2d" not in out:
        ids = torch.arange(out["d2t"].numel()) + out["d2t"].long()
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids.clamp(0, vocab - 1)] = True
        out["t2d"] = t2d
    return out


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, vocab: int, where: str) -> None:
    """EAGLE-3 maps must agree: draft id i is target id i + d2t[i], distinct, in range, marked in t2d."""
    ids = torch.arange(d2t.numel()) + d2t.long()
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab or ids.unique().numel() != ids.numel()):
        raise UserError(f"{where}: d2t maps draft ids outside the target vocabulary or twice; it is corrupt")
    if t2d.numel() != vocab or int(t2d.bool().sum()) != ids.numel() or not bool(t2d.bool()[ids].all()):
        raise UserError(f"{where}: t2d disagrees with d2t; the vocabulary maps are corrupt")


def eagle3_feature_layers(config: dict[str, Any]) -> list[int] | None:
    """Our feature layers (indices into HF ``hidden_states``: the input of layer i) from an EAGLE-3 config.

    vLLM reads a top-level ``eagle_aux_hidden_state_layer_ids`` as layer inputs (same as ours);
    SGLang/ModelOpt's ``eagle_config.eagle_aux_hidden_state_layer_ids`` name layer *outputs*
    (SGLang captures ``id + 1``). None: the EAGLE-3 default, inputs of 2, L//2, L-3.
    """
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return [int(i) for i in ids]
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        return [int(i) + 1 for i in nested]
    return None


def eagle_layer_config(target: nn.Module, official: dict[str, Any]) -> dict[str, Any]:
    """The target's config with the official layer's own sizes (MLP width, kv heads, eps) applied."""
    cfg = target.config.to_dict()
    cfg.update({k: official[k] for k in EAGLE_LAYER_KEYS if k in official})
    return cfg


def check_embedding(sd: dict[str, torch.Tensor], target: nn.Module, where: str) -> None:
    """An embedding copy in the checkpoint must be the target's: otherwise it was trained for another model."""
    emb = sd.get("embed_tokens.weight")
    if emb is None:
        return
    own = target.get_input_embeddings().weight.detach().to("cpu", torch.float32)
    if tuple(emb.shape) != tuple(own.shape) or not torch.allclose(emb.float(), own, rtol=1e-2, atol=1e-3):
        raise UserError(
            f"{where}: its embed_tokens copy differs from the target's embedding; the drafter was trained "
            "for another target model, load it with that one"
        )


def check_backbone(ckpt: OfficialCheckpoint, target: nn.Module) -> int:
    """Medusa-2: the target must be the checkpoint's own fine-tuned backbone; returns tensors compared.

    Every backbone tensor present in the target is compared after casting to the target's dtype
    (what loading the target from these files does), so the original base model is refused.
    """
    own = target.state_dict()
    compared = 0
    for k, v in iter_tensors(ckpt.files, keep=lambda k: not k.startswith(MEDUSA2_PREFIX) and k in own):
        mine = own[k].detach()
        if tuple(mine.shape) != tuple(v.shape) or not torch.equal(v.to(mine.dtype), mine.to("cpu")):
            raise UserError(
                f"{ckpt.where()} holds Medusa-2 heads trained jointly with a fine-tuned backbone, and the "
                f"target differs from that backbone (first at {k}); never pair them with the original base "
                f"model: load the target from this checkpoint (target.name_or_path={ckpt.directory})"
            )
        compared += 1
    if compared == 0:
        raise UserError(
            f"{ckpt.where()}: none of its backbone tensors match the target's parameter names, so the target "
            f"cannot be the fine-tuned backbone these Medusa-2 heads need; load the target from {ckpt.directory}"
        )
    return compared


def build_medusa(ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint) -> tuple[Drafter, dict]:
    from draftheads.heads.medusa import MedusaHeads

    if ckpt.layout == "medusa-2":
        check_backbone(ckpt, target)
        sd = {
            k[len(MEDUSA2_PREFIX) :]: v
            for k, v in iter_tensors(ckpt.files, keep=lambda k: k.startswith(MEDUSA2_PREFIX))
        }
    else:
        sd = read_tensors(ckpt.files)
    num_heads, num_layers, lm_head = medusa_spec(list(sd), ckpt.where())
    claimed = ckpt.config.get("medusa_num_heads")
    if claimed is not None and claimed != num_heads:
        log.info(
            "%s: config says medusa_num_heads=%s, the weights hold %d heads; using %d",
            ckpt.directory,
            claimed,
            num_heads,
            num_heads,
        )
    drafter = MedusaHeads(fp, num_heads=num_heads, num_layers=num_layers, lm_head=lm_head)
    return drafter, medusa_tensors(sd, num_layers)


def build_eagle(ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint) -> tuple[Drafter, dict]:
    from draftheads.heads.eagle import EagleDrafter

    sd = read_tensors(ckpt.files)
    check_embedding(sd, target, ckpt.where())
    layer_cfg = eagle_layer_config(target, ckpt.config)
    if ckpt.layout == "eagle-1":
        n = len({k.split(".")[1] for k in sd if k.startswith("layers.")})
        drafter = EagleDrafter(fp, target_config=layer_cfg, version=1, num_decoder_layers=n)
        return drafter, eagle1_tensors(sd, fp.hidden_size)
    target_hidden = ckpt.config.get("target_hidden_size")
    if target_hidden is not None and target_hidden != ckpt.config.get("hidden_size", fp.hidden_size):
        raise UserError(
            f"{ckpt.where()}: a draft hidden size different from the target's ({target_hidden}) is not supported"
        )
    lm = sd.get("lm_head.weight")
    if lm is None or "d2t" not in sd:
        raise UserError(
            f"{ckpt.where()}: an EAGLE-3 checkpoint needs lm_head.weight and d2t; it is incomplete"
        )
    drafter = EagleDrafter(
        fp,
        target_config=layer_cfg,
        version=3,
        num_decoder_layers=1,
        feature_layers=eagle3_feature_layers(ckpt.config),
        draft_vocab_size=int(lm.shape[0]),
    )
    tensors = eagle3_tensors(sd, fp.vocab_size)
    check_vocab_maps(tensors["d2t"], tensors["t2d"], fp.vocab_size, ckpt.where())
    return drafter, tensors


BUILDERS: dict[str, Callable[[OfficialCheckpoint, nn.Module, TargetFingerprint], tuple[Drafter, dict]]] = {
    "medusa-v1": build_medusa,
    "medusa-v2": build_medusa,
    "medusa-2": build_medusa,
    "eagle-1": build_eagle,
    "eagle-3": build_eagle,
}


def check_tensors(drafter: Drafter, tensors: dict[str, torch.Tensor], ckpt: OfficialCheckpoint) -> None:
    """Strict key and shape check, with errors that name the official file and the target."""
    own = drafter.state_dict()
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise UserError(
            f"{ckpt.where()}: keys do not match an {ckpt.layout} drafter for this target "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); the checkpoint is incomplete or another layout"
        )
    base = ckpt.config.get("base_model_name_or_path") or ckpt.config.get("_name_or_path")
    for k, v in own.items():
        if tuple(v.shape) != tuple(tensors[k].shape):
            raise UserError(
                f"{ckpt.where()}: tensor {k} has shape {tuple(tensors[k].shape)} but target "
                f"{drafter.target_fingerprint.short()} needs {tuple(v.shape)}; it was trained for another "
                f"target{f' ({base})' if base else ''}"
            )


def import_official(
    directory: Path,
    target: nn.Module | None,
    tokenizer: Any = None,
    source: str | None = None,
    revision: str | None = None,
    map_location: str | torch.device = "cpu",
    expected_kind: str | None = None,
    ckpt: OfficialCheckpoint | None = None,
) -> Drafter:
    """Convert the official checkpoint in ``directory`` into a drafter for ``target`` and attach it.

    ``target`` is required: the drafter's shapes and fingerprint come from it. ``source`` and
    ``revision`` (the hub id or path the user gave) are recorded in the drafter's provenance.
    """
    ckpt = ckpt or detect_layout(directory)
    if ckpt is None:
        raise UserError(f"{directory}: no Medusa or EAGLE checkpoint found")
    if target is None:
        raise UserError(
            f"{ckpt.where()} is an official checkpoint; importing it needs its target model: "
            "Drafter.from_pretrained(path, target=model, tokenizer=tok), or target=... on the command line"
        )
    kind = "medusa" if ckpt.layout.startswith("medusa") else "eagle"
    if expected_kind and expected_kind != kind:
        raise UserError(
            f"{ckpt.where()} holds a drafter of kind {kind!r}, not {expected_kind!r}; use Drafter.from_pretrained"
        )
    fp = fingerprint(target, tokenizer)
    drafter, tensors = BUILDERS[ckpt.layout](ckpt, target, fp)
    check_tensors(drafter, tensors, ckpt)
    drafter.load_state_dict(tensors, strict=True)
    drafter.provenance = {
        "imported_from": {
            "layout": ckpt.layout,
            "source": source or str(directory),
            "revision": revision,
            "files": [f.name for f in ckpt.files],
            "config": ckpt.config,
        }
    }
    drafter.to(map_location)
    return drafter.attach(target)
