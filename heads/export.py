"""``draftheads export heads=DIR format=vllm|sglang|speculators out=DIR``: write a drafter for serving.

``format=speculators`` writes vLLM's ``speculators`` layout (:mod:`draftheads.heads.speculators`),
built from the vLLM layout below and served with ``vllm serve DIR`` alone.

What each engine's loader reads, and the rules it imposes, are in :mod:`draftheads.heads.engines`
(the spec table :data:`~draftheads.heads.engines.FORMATS` and the rule list
:data:`~draftheads.heads.engines.RULES`, each rule with the engine file it comes from). Every
export is validated against them before it is reported done.

EAGLE-3 auxiliary layers: our ``feature_layers`` index HF ``hidden_states`` (the *input* of
layer i). vLLM's top-level ``eagle_aux_hidden_state_layer_ids`` uses the same convention;
SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids`` names layer *outputs* (it captures
``id + 1``), so it is written as ``i - 1``.

DFlash: z-lab's layout, which both engines load as ``DFlashDraftModel`` (a Qwen3 config with
``dflash_config.mask_token_id``, ``dflash_config.target_layer_ids`` = our ``feature_layers - 1``,
since both engines read them as layer outputs, ``block_size`` and ``num_target_layers``; our
tensor names without a ``model.`` prefix, and neither the embedding nor the lm_head). A reduced
draft vocabulary is written as vLLM reads it (``draft_vocab_size``, ``lm_head`` [Vd, H] from the
target's rows, ``d2t``); SGLang cannot read one, so that export is refused.

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
from draftheads.conf.schema.layers import feature_layers_problem
from draftheads.heads.base import Drafter
from draftheads.heads.card import num_speculative_tokens, serve_command, sglang_refusal
from draftheads.heads.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    atomic_write,
    holds_checkpoint,
    package_version,
    read_config,
    resolve_checkpoint_dir,
)
from draftheads.heads.convert import detect_layout
from draftheads.heads.engines import ENGINES, FORMATS, RULES, validate_export
from draftheads.heads.layouts import DFLASH_ARCHITECTURE
from draftheads.heads.speculators import (
    check_verifier_folder,
    dflash_to_speculators,
    eagle3_to_speculators,
    speculators_section,
)
from draftheads.heads.target import load_target

__all__ = ["ENGINES", "FORMATS", "RULES", "export", "export_drafter", "validate_export"]

SPECULATORS = "speculators"
FORMAT_NAMES = (*ENGINES, SPECULATORS)
LLAMA_LAYER_TYPES = ("llama", "mistral")  # decoder layers the engines' Llama EAGLE drafters can load
EXPORT_RECORD = "export.json"  # marks a directory draftheads exported into (it may be rewritten)


# ---- conversion -------------------------------------------------------------------------------
def llama_config(drafter: Drafter, architectures: list[str]) -> dict[str, Any]:
    """An HF Llama config for an EAGLE drafter's layers (what the engines' Llama drafters read)."""
    lc = drafter.layer_config
    if (
        lc.model_type not in LLAMA_LAYER_TYPES
        or getattr(lc, "attention_bias", False)
        or getattr(lc, "mlp_bias", False)
    ):
        raise UserError(
            f"the drafter's layers are {lc.model_type} decoder layers; vLLM and SGLang load EAGLE drafters as "
            "Llama layers, so only drafters for Llama/Mistral-style targets (no attention/MLP bias) can be exported"
        )
    tc = drafter.target_config
    rope = dict(getattr(lc, "rope_parameters", None) or {})
    fp = drafter.target_fingerprint
    cfg = {
        "architectures": architectures,
        "model_type": "llama",
        "hidden_size": fp.hidden_size,
        "intermediate_size": lc.intermediate_size,
        "num_attention_heads": lc.num_attention_heads,
        "num_key_value_heads": lc.num_key_value_heads,
        "head_dim": getattr(lc, "head_dim", None) or fp.hidden_size // lc.num_attention_heads,
        "num_hidden_layers": drafter.num_decoder_layers,
        "vocab_size": fp.vocab_size,
        "rms_norm_eps": lc.rms_norm_eps,
        "hidden_act": lc.hidden_act,
        "max_position_embeddings": lc.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", getattr(lc, "rope_theta", 10000.0)),
        "rope_parameters": rope or None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": tc.get("bos_token_id"),
        "eos_token_id": tc.get("eos_token_id"),
        "pad_token_id": tc.get("pad_token_id"),
        "torch_dtype": str(drafter.fc.weight.dtype).replace("torch.", ""),
    }
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return cfg


def export_eagle1(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE-1: our names are the official ones. vLLM builds fc without a bias: a nonzero one is
    refused; SGLang builds it with one: a bias-less drafter gets an exact zero bias."""
    fp = drafter.target_fingerprint
    if drafter.feature_layers() != [fp.num_layers]:
        raise UserError(
            f"this EAGLE-1 drafter reads target layer {drafter.feature_layers()}; the engines feed it the "
            f"final normed hidden state (layer {fp.num_layers}) only"
        )
    sd = {k: v for k, v in drafter.state_to_save().items() if k != "embed_tokens.weight"}
    if engine == "vllm":
        bias = sd.pop("fc.bias", None)
        if bias is not None and bool(bias.ne(0).any()):
            raise UserError(
                f"vLLM builds the EAGLE fc layer without a bias and silently drops fc.bias, but this drafter's "
                f"bias is nonzero (max |b| = {bias.abs().max().item():.3g}); serve it with format=sglang, "
                "or retrain it with draft.fc_bias=false"
            )
        return llama_config(drafter, ["LlamaForCausalLM"]), sd
    if "fc.bias" not in sd:
        sd["fc.bias"] = torch.zeros(fp.hidden_size, dtype=sd["fc.weight"].dtype)
    return llama_config(drafter, ["LlamaForCausalLMEagle"]), sd


def export_eagle3(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE-3: ``layers.0.*`` -> ``midlayer.*``, ``hidden_norm`` -> ``midlayer.hidden_norm``; aux layer ids per engine."""
    fp = drafter.target_fingerprint
    if drafter.num_decoder_layers != 1:
        raise UserError(
            f"the engines' EAGLE-3 drafters have one layer; this one has {drafter.num_decoder_layers}"
        )
    layers = drafter.feature_layers()
    problem = feature_layers_problem(layers, 3, fp.num_layers, last=fp.num_layers - 1)
    if problem:
        raise UserError(
            f"{problem}; the engines capture layer inputs 1..{fp.num_layers - 1} only, so layer "
            f"{fp.num_layers} (the final normed state) and layer 0 cannot be served"
        )
    sd: dict[str, torch.Tensor] = {}
    for k, v in drafter.state_to_save().items():
        if k == "embed_tokens.weight":
            continue
        if k == "hidden_norm.weight":
            k = "midlayer.hidden_norm.weight"
        elif k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0.") :]
        sd[k] = v
    sd["d2t"], sd["t2d"] = sd["d2t"].to(torch.int64), sd["t2d"].to(torch.bool)
    cfg = llama_config(drafter, ["LlamaForCausalLMEagle3"])
    cfg.update(draft_vocab_size=drafter.draft_vocab_size, target_hidden_size=fp.hidden_size)
    if engine == "vllm":
        cfg.update(eagle_aux_hidden_state_layer_ids=layers, **drafter.norm_flags)
    else:
        sglang_norm_refusal(drafter.norm_flags)
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers],
            "use_aux_hidden_state": True,
        }
    return cfg, sd


def sglang_norm_refusal(flags: dict[str, bool]) -> None:
    """SGLang's EAGLE-3 loader was read for none of the norm variants: refuse a drafter with one."""
    on = [k for k, v in flags.items() if v]
    if on:
        raise UserError(
            f"this EAGLE-3 drafter uses {', '.join(on)}, which SGLang's EAGLE-3 loader is not known to read; "
            "export it with format=vllm or format=speculators"
        )


def dflash_config(drafter: Drafter) -> dict[str, Any]:
    """The Qwen3 config both engines' ``DFlashDraftModel`` loaders read, for ``drafter``'s layers.

    ``rope_theta`` is always written, so no loader falls back to a default of its own.
    """
    fp, shape, n = drafter.target_fingerprint, drafter.layer_shape, drafter.num_decoder_layers
    rope = dict(shape["rope_parameters"])
    tc = drafter.target_config
    cfg = {
        "architectures": [DFLASH_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": fp.hidden_size,
        "intermediate_size": shape["intermediate_size"],
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["head_dim"],
        "num_hidden_layers": n,
        "vocab_size": fp.vocab_size,
        "rms_norm_eps": shape["rms_norm_eps"],
        "hidden_act": shape["hidden_act"],
        "attention_bias": bool(shape["attention_bias"]),
        "max_position_embeddings": shape["max_position_embeddings"],
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None
        if rope.get("rope_type", "default") == "default"
        else {k: v for k, v in rope.items() if k != "rope_theta"},
        "rope_parameters": rope,
        "layer_types": ["full_attention"] * n,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "block_size": drafter.block_size,
        "num_target_layers": fp.num_layers,
        "dflash_config": {
            "mask_token_id": drafter.mask_token_id,
            "target_layer_ids": [i - 1 for i in drafter.feature_layers()],
        },
        "bos_token_id": tc.get("bos_token_id"),
        "eos_token_id": tc.get("eos_token_id"),
        "pad_token_id": tc.get("pad_token_id"),
        "torch_dtype": str(drafter.fc.weight.dtype).replace("torch.", ""),
    }
    if drafter.reduced_vocab:
        cfg["draft_vocab_size"] = drafter.draft_vocab_size
    return cfg


def export_dflash(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """DFlash: our tensor names are z-lab's; ``d2t``/``t2d`` are dropped (full vocabulary) or, for
    vLLM's reduced vocabulary, ``d2t`` is kept beside the target's lm_head rows of the draft ids."""
    act = drafter.layer_shape["hidden_act"]
    if act != "silu":
        raise UserError(
            f"this DFlash drafter's MLP uses hidden_act={act}; vLLM's and SGLang's DFlash layers are SiLU-gated "
            "only, so it cannot be served by them (use the draftheads decoder)"
        )
    sd = {k: v for k, v in drafter.state_to_save().items() if k not in ("d2t", "t2d")}
    if drafter.reduced_vocab:
        if engine != "vllm":
            raise UserError(sglang_refusal(drafter.config_dict()))
        if "lm_head" not in drafter._shared:
            raise UserError(
                "this DFlash drafter has a reduced vocabulary, whose lm_head rows vLLM needs in the file; load "
                f"the target to export it (target=... for {drafter.target_fingerprint.name})"
            )
        sd["lm_head.weight"] = drafter.head().weight.detach().to("cpu")
        sd["d2t"] = drafter.d2t.to(torch.int64)
    return dflash_config(drafter), sd


def export_medusa(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Medusa -> vLLM: ``blocks.{i}.{j}.linear`` -> ``blocks.{i}.layers.{j}``.

    Heads sharing the target's lm_head are written with ``original_lm_head: true`` and that
    lm_head once, as ``lm_heads.0.weight`` (vLLM shares it across heads), not a copy per head.
    """
    if engine != "vllm":
        raise UserError(
            "SGLang has no Medusa support; export Medusa heads with format=vllm, or train an EAGLE drafter for SGLang"
        )
    fp = drafter.target_fingerprint
    sd: dict[str, torch.Tensor] = {}
    for k, v in drafter.state_to_save().items():
        parts = k.split(".")
        if parts[0] == "blocks":  # blocks.{i}.{j}.linear.{weight,bias}
            sd[f"blocks.{parts[1]}.layers.{parts[2]}.{parts[4]}"] = v
        else:
            sd[k] = v
    shared = drafter.lm_head_mode == "shared"
    if shared:
        if "lm_head" not in drafter._shared:
            raise UserError(
                "these Medusa heads share the target's lm_head, which vLLM needs in the file; load the target "
                f"to export them (target=... for {fp.name})"
            )
        sd["lm_heads.0.weight"] = drafter.shared("lm_head").weight.detach().to("cpu")
    cfg = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": fp.hidden_size,
        "vocab_size": fp.vocab_size,
        "num_heads": drafter.num_heads,
        "num_hidden_layers": drafter.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": shared,
        "max_paths": 64,
        "topk": 10,
        "truncated_vocab_size": None,
    }
    return cfg, sd


def check_out_dir(out: Path, source: Path | None = None) -> None:
    """Refuse, before anything is written, an ``out`` that would overwrite a drafter or is unusable.

    Allowed: a new path, an empty directory, or a previous export (it holds ``export.json``)
    that is not ``source``.
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
    parent = next((p for p in (out, *out.parents) if p.exists()), None)
    try:  # os.access says yes to root even on /proc: try it
        if parent is None:
            raise OSError("no existing parent")
        Path(tempfile.mkdtemp(prefix=".draftheads-probe-", dir=parent)).rmdir()
    except OSError:
        raise UserError(f"out={out}: {parent} is not writable; pass a directory you can write to") from None


def exported_from(out: Path) -> str:
    """The drafter directory an earlier export in ``out`` was written from ("" when unknown)."""
    try:
        record = json.loads((out / EXPORT_RECORD).read_text())
    except (OSError, ValueError):
        return ""
    return str(record.get("source") or "") if isinstance(record, dict) else ""


def export_drafter(
    drafter: Drafter,
    engine: str,
    out: str | os.PathLike,
    source: Path | None = None,
    verifier: str | None = None,
) -> Path:
    """Write ``drafter`` for ``engine`` into ``out`` (config.json + model.safetensors) and validate it.

    Shared-lm_head Medusa heads must be attached to their target (its lm_head is written).
    ``source`` (the drafter's directory) is never written to. ``verifier`` (speculators only) is
    the local folder of the target the export is served with, recorded instead of its Hub name.
    """
    engine = engine.lower()
    if engine not in FORMAT_NAMES:
        raise UserError(f"format={engine} is not supported; use one of {', '.join(FORMAT_NAMES)}")
    out = Path(out)
    check_out_dir(out, source if source is not None else drafter.source_dir)
    if engine == SPECULATORS:
        cfg, sd = export_speculators(drafter, verifier)
    elif drafter.kind == "medusa":
        cfg, sd = export_medusa(drafter, engine)
    elif drafter.kind == "dflash":
        cfg, sd = export_dflash(drafter, engine)
    elif drafter.version == 1:
        cfg, sd = export_eagle1(drafter, engine)
    else:
        cfg, sd = export_eagle3(drafter, engine)
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
    drafter: Drafter, verifier: str | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE-3 and DFlash in speculators' layout, from their vLLM layout (same checks, same weights).

    The verifier is the drafter's target; the default proposal is the greedy chain the model
    card names (``block_size - 1`` tokens for DFlash). Speculators has no EAGLE-1 or Medusa type.
    ``verifier`` (a local copy of the target, checked to be it) replaces the target's name.
    """
    refusal = speculators_refusal(drafter.kind, drafter.spec().get("version"))
    if refusal:
        raise UserError(refusal)
    fp = drafter.target_fingerprint
    k = num_speculative_tokens({"kind": drafter.kind, "spec": drafter.spec()})
    name = check_verifier_folder(verifier, fp) if verifier else fp.name
    if drafter.kind == "dflash":
        section = speculators_section("dflash", k, name, fp.architecture)
        return dflash_to_speculators(*export_dflash(drafter, "vllm"), section)
    section = speculators_section("eagle3", k, name, fp.architecture)
    return eagle3_to_speculators(*export_eagle3(drafter, "vllm"), section)


def speculators_refusal(kind: str, version: int | None) -> str | None:
    """Why speculators cannot hold a drafter of ``kind`` (EAGLE ``version``), or None."""
    if kind == "medusa" or (kind == "eagle" and version == 1):
        what = "Medusa heads" if kind == "medusa" else "an EAGLE-1 drafter"
        return (
            f"speculators has no model type for {what} (it defines eagle3 and dflash drafters); "
            "export it with format=vllm"
        )
    return None


def needs_target(directory: Path) -> bool:
    """Official layouts (imported for a target), shared-lm_head Medusa heads and reduced-vocabulary
    DFlash drafters (the lm_head, or its draft-vocabulary rows, is written)."""
    if detect_layout(directory) is not None:
        return True
    conf = read_config(directory)
    if conf["kind"] == "dflash":
        return reduced_dflash_vocab(conf) is not None
    return conf["kind"] == "medusa" and conf["spec"].get("lm_head") == "shared"


def reduced_dflash_vocab(conf: dict[str, Any]) -> int | None:
    """A DFlash checkpoint's draft vocabulary size when it is smaller than the target's, else None."""
    vocab = conf["spec"].get("draft_vocab_size")
    return vocab if vocab is not None and vocab < conf["target"]["vocab_size"] else None


def check_engine_fits(directory: Path, engine: str) -> None:
    """Refuse, before the target is loaded, a draftheads checkpoint the engine cannot serve."""
    if detect_layout(directory) is not None:
        return
    conf = read_config(directory)
    refusal = sglang_refusal(conf) if conf["kind"] == "dflash" and engine == "sglang" else None
    if engine == SPECULATORS:
        refusal = speculators_refusal(conf["kind"], conf["spec"].get("version"))
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
    check_out_dir(Path(cfg.out), directory)  # before loading anything
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
    target_name = verifier or drafter.target_fingerprint.name
    if drafter.requires_adapters:
        target_name = "MERGED_TARGET"
        print(
            "note: these Medusa-2 heads were trained with LoRA adapters on the target; serve them with the "
            "target with those adapters merged (peft merge_and_unload), never with the plain target"
        )
    k = num_speculative_tokens({"kind": drafter.kind, "spec": drafter.spec()})
    print(f"exported {drafter.kind} drafter to {out} ({engine} {fmt.method}); serve it with:")
    print("  " + serve_command(engine, fmt.method, target_name, str(out), k))
    if note:
        print(note)
    return out


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
