"""Import official Medusa, EAGLE and DFlash checkpoints: detect the layout, map the keys, load strictly.

``Drafter.from_pretrained(dir_or_hub_id, target=model)`` calls :func:`detect_layout` and, when
the directory is not a draftheads checkpoint, :func:`convert_official`, which returns the
drafter's kind, its constructor arguments and its tensors under our names; the drafter
classes are built by the caller, so this module never imports them. Layouts:

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
``eagle-3``     same                                             ``midlayer.*`` (or ``layers.0.*``
                                                                 with ``hidden_norm``), ``fc`` over
                                                                 3H, ``norm``, ``lm_head``, ``d2t``
``dflash``      ``config.json`` naming ``DFlashDraftModel`` (or  ``layers.{i}.*`` (q/k norms), ``fc``
                with ``dflash_config``) + ``model.safetensors``  over K·H, ``hidden_norm``, ``norm``;
                                                                 optional ``model.`` prefix, and
                                                                 ``lm_head`` [Vd,H] + ``d2t`` (vLLM)
==============  ===============================================  =====================================

DFlash (z-lab's ``DFlashDraftModel``, and the vLLM/SGLang exports of :mod:`draftheads.heads.export`):
the tensor names are ours; the config is a Qwen3 config whose shape keys build the drafter's
layers, with ``dflash_config.mask_token_id``, ``dflash_config.target_layer_ids`` (layer
*outputs*: our ``feature_layers`` are those plus one), ``block_size`` (top level or in
``dflash_config``) and ``num_target_layers``. A checkpoint for another target (hidden size,
vocabulary, depth, layer ids, mask token), a block size below 2, sliding-window or causal
layers, and missing or extra tensors are refused in one line.

Why the target is required: official files carry no usable fingerprint (Medusa's config even
gets the head count wrong), so the drafter is built for the target the user loads it with,
every tensor's shape is checked against that target, and the fingerprint is taken from it.
Medusa head and layer counts come from the keys, never from the config. Pickles are read
with ``torch.load(weights_only=True)`` only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DFLASH_LAYER_KEYS as LAYER_KEYS
from draftheads.conf.schema.heads import dflash_layers_problem
from draftheads.heads.layouts import (
    MEDUSA2_PREFIX,
    MEDUSA_KEY,
    OfficialCheckpoint,
    detect_layout,
    iter_tensors,
    read_tensors,
)
from draftheads.heads.reduced_vocab import check_vocab_maps, t2d_from_d2t
from draftheads.heads.speculators import check_verifier
from draftheads.heads.target_fingerprint import TargetFingerprint

__all__ = ["OfficialCheckpoint", "convert_official", "detect_layout", "import_provenance"]

log = logging.getLogger(__name__)
# Keys of an official EAGLE layer config that shape the drafter's own layers without touching
# the rotary embedding it shares with the target.
EAGLE_LAYER_KEYS = ("intermediate_size", "num_key_value_heads", "rms_norm_eps", "hidden_act")
# Keys of a DFlash checkpoint's Qwen3 config that shape the drafter's layers (DFlashDrafter's layer_config).
DFLASH_LAYER_KEYS = tuple(k for k in LAYER_KEYS if k != "rope_parameters")  # rope is read apart


# ---- conversion ----------------------------------------------------------------------------
def medusa_spec(keys: list[str], where: str) -> tuple[int, int, str]:
    """(num_heads, num_layers, lm_head mode) inferred from Medusa-1 keys; strict about stray keys."""
    blocks: dict[int, set[int]] = {}
    heads_with_lm: dict[int, int] = {}
    for k in keys:
        m = MEDUSA_KEY.match(k)
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


def eagle1_tensors(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Official EAGLE-1 keys are ours, minus the embedding copy (a bias-less ``fc`` builds ``fc_bias=False``)."""
    return {k: v for k, v in sd.items() if k != "embed_tokens.weight"}


def eagle3_tensors(sd: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """Official EAGLE-3 keys -> ours: ``midlayer.hidden_norm`` (or vLLM's ``layers.0.hidden_norm``)
    -> ``hidden_norm``, ``midlayer.*`` -> ``layers.0.*``.

    A missing ``t2d`` (ModelOpt exports only ``d2t``) is rebuilt from ``d2t``.
    """
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == "embed_tokens.weight":
            continue
        if k in ("midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight"):
            out["hidden_norm.weight"] = v
        elif k.startswith("midlayer."):
            out["layers.0." + k[len("midlayer.") :]] = v
        else:
            out[k] = v
    if "d2t" in out and "t2d" not in out:
        out["t2d"] = t2d_from_d2t(out["d2t"], vocab)
    return out


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


def build_medusa(
    ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """Medusa layouts -> (``"medusa"``, MedusaHeads arguments, tensors under our names)."""
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
    spec = {"num_heads": num_heads, "num_layers": num_layers, "lm_head": lm_head}
    return "medusa", spec, medusa_tensors(sd, num_layers)


def build_eagle(
    ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE layouts -> (``"eagle"``, EagleDrafter arguments, tensors under our names)."""
    sd = read_tensors(ckpt.files)
    check_embedding(sd, target, ckpt.where())
    layer_cfg = eagle_layer_config(target, ckpt.config)
    if ckpt.layout == "eagle-1":
        n = len({k.split(".")[1] for k in sd if k.startswith("layers.")})
        spec = {"target_config": layer_cfg, "version": 1, "num_decoder_layers": n}
        spec["fc_bias"] = "fc.bias" in sd
        return "eagle", spec, eagle1_tensors(sd)
    target_hidden = ckpt.config.get("target_hidden_size")
    if target_hidden is not None and target_hidden != ckpt.config.get("hidden_size", fp.hidden_size):
        raise UserError(
            f"{ckpt.where()}: a draft hidden size different from the target's ({target_hidden}) is not supported"
        )
    lm = sd.get("lm_head.weight")
    if ckpt.origin == "speculators" and lm is not None and lm.shape[0] == fp.vocab_size:
        sd.setdefault("d2t", torch.zeros(fp.vocab_size, dtype=torch.long))  # a full vocabulary has no maps
    if lm is None or "d2t" not in sd:
        raise UserError(
            f"{ckpt.where()}: an EAGLE-3 checkpoint needs lm_head.weight and d2t; it is incomplete"
        )
    spec = {
        "target_config": layer_cfg,
        "version": 3,
        "num_decoder_layers": 1,
        "feature_layers": eagle3_feature_layers(ckpt.config),
        "draft_vocab_size": int(lm.shape[0]),
    }
    tensors = eagle3_tensors(sd, fp.vocab_size)
    check_vocab_maps(tensors["d2t"], tensors["t2d"], fp.vocab_size, ckpt.where())
    return "eagle", spec, tensors


# ---- DFlash ------------------------------------------------------------------------------------
def is_int(value: Any) -> bool:
    """An integer that is not a bool (JSON ``true`` would pass ``isinstance(v, int)``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def zlab_default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's ``target_layer_ids`` when a config lists none: the middle layer for a one-layer
    drafter, else ``num_draft_layers`` ids spread evenly over layers 1..L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, span = 1, num_target_layers - 4
    return [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def dflash_setting(config: dict[str, Any], key: str) -> Any:
    """A DFlash setting from ``dflash_config``, else from the top level (``block_size`` lives in
    either, depending on the checkpoint's age)."""
    nested = config.get("dflash_config") or {}
    return nested[key] if key in nested else config.get(key)


def check_dflash_target(config: dict[str, Any], fp: TargetFingerprint, where: str) -> None:
    """A DFlash config's hidden size, vocabulary and target depth must be the target's."""
    for key, own, what in (
        ("hidden_size", fp.hidden_size, "hidden size"),
        ("vocab_size", fp.vocab_size, "vocabulary size"),
        ("num_target_layers", fp.num_layers, "layer count"),
    ):
        value = dflash_setting(config, key)
        if value is not None and value != own:
            raise UserError(
                f"{where}: it was trained for a target with {what} {value}, but {fp.short()} has {own}; "
                "load it with the target it was trained for"
            )


def dflash_layers_from_config(
    config: dict[str, Any], num_draft_layers: int, fp: TargetFingerprint, where: str
) -> list[int]:
    """Our ``feature_layers`` from ``dflash_config.target_layer_ids`` (layer outputs: ours are
    those plus one), z-lab's default when absent; refused when the target cannot supply them."""
    ids = dflash_setting(config, "target_layer_ids")
    if ids is None:
        ids = zlab_default_layer_ids(fp.num_layers, num_draft_layers)
    if not isinstance(ids, list) or not ids or not all(is_int(i) for i in ids):
        raise UserError(
            f"{where}: dflash_config.target_layer_ids={ids!r} must be a non-empty list of layer ids"
        )
    last = fp.num_layers - 2
    if min(ids) < 0 or max(ids) > last:
        raise UserError(
            f"{where}: dflash_config.target_layer_ids={ids} reach outside 0..{last}, the layer outputs that "
            f"draftheads and the engines feed from {fp.short()}; it was trained for another target (or reads "
            "the final normed state, which no engine captures)"
        )
    layers = [i + 1 for i in ids]
    problem = dflash_layers_problem(layers, fp.num_layers)
    if problem:
        raise UserError(f"{where}: dflash_config.target_layer_ids={ids}: {problem.split(': ', 1)[1]}")
    return layers


def dflash_block_size(config: dict[str, Any], where: str) -> int:
    """``block_size``: an integer of at least 2 (the last accepted token and one drafted token)."""
    block = dflash_setting(config, "block_size")
    if not is_int(block) or block < 2:
        raise UserError(
            f"{where}: block_size={block!r} must be an integer of at least 2 (the last accepted token and "
            "at least one drafted token); set the block size the drafter was trained with in config.json"
        )
    return block


def dflash_mask_token(config: dict[str, Any], fp: TargetFingerprint, where: str) -> int:
    """``dflash_config.mask_token_id``: a token id of the target's vocabulary."""
    mask = dflash_setting(config, "mask_token_id")
    if mask is None:
        raise UserError(
            f"{where}: config.json names no dflash_config.mask_token_id; add the mask token id the drafter "
            "was trained with"
        )
    if not is_int(mask) or not 0 <= mask < fp.vocab_size:
        raise UserError(
            f"{where}: dflash_config.mask_token_id={mask!r} is not a token id of {fp.short()} "
            f"(0..{fp.vocab_size - 1}); it was trained for another target"
        )
    return mask


def dflash_layer_config(config: dict[str, Any], where: str) -> tuple[int, dict[str, Any]]:
    """(number of layers, our ``layer_config``) from the checkpoint's Qwen3 config, read as z-lab's
    model reads it (``Qwen3Config`` defaults, ``rope_theta``/``rope_scaling`` or ``rope_parameters``).

    Sliding-window layers (causal in the engines) and ``dflash_config.causal`` are refused: this
    drafter attends to the whole context and the whole block in every layer.
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import Qwen3Config

    if (config.get("dflash_config") or {}).get("causal"):
        raise UserError(
            f"{where}: dflash_config.causal=true (a causal-in-block variant) is not supported; draftheads "
            "drafts each block non-causally"
        )
    keys = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
    try:
        qc = Qwen3Config.from_dict(keys)
    except (ValueError, TypeError, StrictDataclassError) as e:
        detail = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        raise UserError(
            f"{where}: config.json is not a valid Qwen3 config ({detail[-1]}); it is damaged"
        ) from None
    if "sliding_attention" in (qc.layer_types or []):
        raise UserError(
            f"{where}: layer_types has sliding_attention layers; draftheads' DFlash drafter attends to the "
            "whole context in every layer, so this checkpoint cannot be loaded"
        )
    shape = {k: getattr(qc, k) for k in DFLASH_LAYER_KEYS}
    shape["rope_parameters"] = dict(qc.rope_parameters or {})
    return int(qc.num_hidden_layers), json.loads(json.dumps(shape))


def check_shared_rows(weight: torch.Tensor, target: nn.Module, ids: torch.Tensor, where: str) -> None:
    """An lm_head in the file must be the target's (its rows ``ids``): draftheads shares the target's."""
    own = target.get_output_embeddings().weight.detach().to("cpu", torch.float32)
    if tuple(weight.shape) != (ids.numel(), own.shape[1]) or not torch.allclose(
        weight.float(), own[ids], rtol=1e-2, atol=1e-3
    ):
        raise UserError(
            f"{where}: its lm_head.weight is not the target's lm_head (rows of the draft vocabulary); draftheads "
            "drafts with the target's own head, so load it with the target it was trained for"
        )


def dflash_tensors(
    sd: dict[str, torch.Tensor], target: nn.Module, fp: TargetFingerprint, where: str
) -> tuple[dict[str, torch.Tensor], int]:
    """DFlash keys -> ours, and the draft vocabulary size.

    A ``model.`` prefix and rotary caches are dropped; an embedding copy or an lm_head must be the
    target's (checked, then dropped: both are shared). A reduced vocabulary comes as vLLM reads it:
    ``d2t`` with ``lm_head`` [Vd, H] (the target's rows ``i + d2t[i]``); ``t2d`` is rebuilt if absent.
    """
    out = {
        (k[len("model.") :] if k.startswith("model.") else k): v
        for k, v in sd.items()
        if not k.endswith("rotary_emb.inv_freq")
    }
    check_embedding(out, target, where)
    out.pop("embed_tokens.weight", None)
    head = out.pop("lm_head.weight", None)
    V = fp.vocab_size
    if "d2t" not in out:
        if head is not None:
            check_shared_rows(head, target, torch.arange(V), where)
        out["d2t"], out["t2d"] = torch.zeros(V, dtype=torch.long), torch.ones(V, dtype=torch.bool)
        return out, V
    out["d2t"] = out["d2t"].long()
    out.setdefault("t2d", t2d_from_d2t(out["d2t"], V))
    check_vocab_maps(out["d2t"], out["t2d"], V, where)
    if head is None:
        raise UserError(
            f"{where}: it has a reduced draft vocabulary (d2t) but no lm_head.weight for it; the checkpoint is incomplete"
        )
    check_shared_rows(head, target, torch.arange(out["d2t"].numel()) + out["d2t"], where)
    return out, int(out["d2t"].numel())


def build_dflash(
    ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """z-lab's DFlash layout (or a vLLM/SGLang DFlash export) -> (``"dflash"``, DFlashDrafter arguments, tensors).

    Every config value is checked against the target before any tensor is read.
    """
    where, config = ckpt.where(), ckpt.config
    check_dflash_target(config, fp, where)
    block = dflash_block_size(config, where)
    mask = dflash_mask_token(config, fp, where)
    num_layers, layer_cfg = dflash_layer_config(config, where)
    layers = dflash_layers_from_config(config, num_layers, fp, where)
    tensors, draft_vocab = dflash_tensors(read_tensors(ckpt.files), target, fp, where)
    spec = {
        "target_config": target.config.to_dict(),
        "mask_token_id": mask,
        "block_size": block,
        "num_decoder_layers": num_layers,
        "feature_layers": layers,
        "draft_vocab_size": draft_vocab,
        "layer_config": layer_cfg,
    }
    return "dflash", spec, tensors


Builder = Callable[
    [OfficialCheckpoint, nn.Module, TargetFingerprint], tuple[str, dict[str, Any], dict[str, torch.Tensor]]
]
BUILDERS: dict[str, Builder] = {
    "medusa-v1": build_medusa,
    "medusa-v2": build_medusa,
    "medusa-2": build_medusa,
    "eagle-1": build_eagle,
    "eagle-3": build_eagle,
    "dflash": build_dflash,
}


def check_tensors(
    own: dict[str, torch.Tensor],
    tensors: dict[str, torch.Tensor],
    ckpt: OfficialCheckpoint,
    fp: TargetFingerprint,
) -> None:
    """Strict key and shape check against the built drafter's state ``own``, naming the file and the target."""
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
                f"{fp.short()} needs {tuple(v.shape)}; it was trained for another "
                f"target{f' ({base})' if base else ''}"
            )


def convert_official(
    ckpt: OfficialCheckpoint,
    target: nn.Module | None,
    fp: TargetFingerprint | None,
    expected_kind: str | None = None,
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """The official checkpoint ``ckpt`` as (kind, constructor arguments, tensors) for ``target``.

    ``target`` is required: the drafter's shapes and fingerprint come from it.
    """
    if target is None or fp is None:
        raise UserError(
            f"{ckpt.where()} is an official checkpoint; importing it needs its target model: "
            "Drafter.from_pretrained(path, target=model, tokenizer=tok), or target=... on the command line"
        )
    if ckpt.origin == "speculators":
        check_verifier(ckpt.source_config, fp.name, fp.architecture, ckpt.where())
    kind = "medusa" if ckpt.layout.startswith("medusa") else "dflash" if ckpt.layout == "dflash" else "eagle"
    if expected_kind and expected_kind != kind:
        raise UserError(
            f"{ckpt.where()} holds a drafter of kind {kind!r}, not {expected_kind!r}; use Drafter.from_pretrained"
        )
    return BUILDERS[ckpt.layout](ckpt, target, fp)


def import_provenance(ckpt: OfficialCheckpoint, source: str | None, revision: str | None) -> dict[str, Any]:
    """What an imported drafter records about where it came from."""
    speculators = ckpt.origin == "speculators"
    return {
        "imported_from": {
            "layout": f"speculators-{ckpt.source_config['speculators_model_type']}"
            if speculators
            else ckpt.layout,
            "source": source or str(ckpt.directory),
            "revision": revision,
            "files": [f.name for f in ckpt.files],
            "config": ckpt.source_config if speculators else ckpt.config,
        }
    }
