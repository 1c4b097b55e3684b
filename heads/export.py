"""``draftheads export heads=DIR format=vllm|sglang out=DIR``: write a drafter in a serving engine's format.

================  ==================  ==================================  =======================================
drafter           engine              config                              tensors
================  ==================  ==================================  =======================================
EAGLE-1           vLLM ``eagle``      Llama config, ``LlamaForCausalLM``  ``fc.weight`` [H,2H] (no bias),
                                      (vLLM renames it Eagle…)            ``layers.{i}.*`` (layer 0: no input norm)
EAGLE-1           SGLang ``EAGLE``    ``LlamaForCausalLMEagle``           ``fc.weight``, ``fc.bias``, ``layers.{i}.*``
EAGLE-3           both ``eagle3``     ``LlamaForCausalLMEagle3``,         ``fc.weight`` [H,3H], ``midlayer.*`` (q/k/v
                                      ``draft_vocab_size``, aux layers    over 2H, ``hidden_norm``), ``norm``,
                                                                          ``lm_head`` [Vd,H], ``d2t``, ``t2d``
Medusa            vLLM ``medusa``     ``model_type: medusa``,             ``blocks.{i}.layers.{j}.{weight,bias}``,
                                      ``MedusaModel``                     ``lm_heads.{i}.weight`` [V,H]
================  ==================  ==================================  =======================================

The expected key names, shapes, dtypes and config fields of each engine loader are written
out once, in :data:`FORMATS` (modelled on vLLM's ``llama_eagle.py``, ``llama_eagle3.py``,
``medusa.py`` and SGLang's ``llama_eagle.py``, ``llama_eagle3.py``; see
``shared/reference/ecosystem.md`` §2). :func:`validate_export` checks a directory against it,
strictly: engines skip unknown keys silently (vLLM drops ``fc.bias``), so an extra key is an
error here. Every export is validated before it is reported done.

EAGLE-3 auxiliary layers: our ``feature_layers`` index HF ``hidden_states`` (the *input* of
layer i). vLLM's top-level ``eagle_aux_hidden_state_layer_ids`` uses the same convention;
SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids`` names layer *outputs* (it captures
``id + 1``), so it is written as ``i - 1``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from draftheads.conf.errors import UserError
from draftheads.heads.base import CONFIG_NAME, WEIGHTS_NAME, Drafter

ENGINES = ("vllm", "sglang")
LLAMA_LAYER_TYPES = ("llama", "mistral")  # decoder layers the engines' Llama EAGLE drafters can load

Shape = tuple[int, ...]


# ---- the spec table ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorRule:
    """One expected tensor: its shape, whether the loader needs it, and its dtype family."""

    shape: Shape
    required: bool = True
    dtype: str = "float"  # "float", "int64" or "bool"


@dataclass(frozen=True)
class EngineFormat:
    """What one engine loader reads: config fields (with fixed values where it insists) and tensors."""

    engine: str
    method: str  # vLLM ``speculative_config.method`` / SGLang ``--speculative-algorithm``
    architectures: list[str] | None  # exact value required in config.json
    model_type: str
    config_fields: tuple[str, ...]
    tensors: Callable[[dict[str, Any]], dict[str, TensorRule]]
    forbidden_config: tuple[str, ...] = ()


def _head_dim(c: dict[str, Any]) -> int:
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def llama_layer_rules(prefix: str, c: dict[str, Any], qkv_in: int, input_norm: bool) -> dict[str, TensorRule]:
    """A Llama decoder layer's tensors (vLLM/SGLang fuse q/k/v and gate/up on load, from these names)."""
    H, hd, inter = c["hidden_size"], _head_dim(c), c["intermediate_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    rules = {
        f"{prefix}self_attn.q_proj.weight": TensorRule((nh * hd, qkv_in)),
        f"{prefix}self_attn.k_proj.weight": TensorRule((nkv * hd, qkv_in)),
        f"{prefix}self_attn.v_proj.weight": TensorRule((nkv * hd, qkv_in)),
        f"{prefix}self_attn.o_proj.weight": TensorRule((H, nh * hd)),
        f"{prefix}mlp.gate_proj.weight": TensorRule((inter, H)),
        f"{prefix}mlp.up_proj.weight": TensorRule((inter, H)),
        f"{prefix}mlp.down_proj.weight": TensorRule((H, inter)),
        f"{prefix}post_attention_layernorm.weight": TensorRule((H,)),
    }
    if input_norm:
        rules[f"{prefix}input_layernorm.weight"] = TensorRule((H,))
    return rules


def eagle1_rules(fc_bias: bool, optional_lm_head: bool) -> Callable[[dict[str, Any]], dict[str, TensorRule]]:
    """EAGLE-1: fc over concat(embedding, feature), then layers; layer 0 has no input norm."""

    def rules(c: dict[str, Any]) -> dict[str, TensorRule]:
        H, V = c["hidden_size"], c["vocab_size"]
        out = {"fc.weight": TensorRule((H, 2 * H)), "embed_tokens.weight": TensorRule((V, H), required=False)}
        if fc_bias:
            out["fc.bias"] = TensorRule((H,))
        if optional_lm_head:
            out["lm_head.weight"] = TensorRule((V, H), required=False)
        for i in range(c["num_hidden_layers"]):
            out.update(llama_layer_rules(f"layers.{i}.", c, H, input_norm=i > 0))
        return out

    return rules


def eagle3_rules(c: dict[str, Any]) -> dict[str, TensorRule]:
    """EAGLE-3 (both engines): one ``midlayer`` whose q/k/v read 2H, own norm, lm_head and vocab maps."""
    H, V = c["hidden_size"], c["vocab_size"]
    Vd, Ht = c["draft_vocab_size"], c.get("target_hidden_size") or c["hidden_size"]
    out = {
        "fc.weight": TensorRule((H, 3 * Ht)),
        "midlayer.hidden_norm.weight": TensorRule((H,)),
        "norm.weight": TensorRule((H,)),
        "lm_head.weight": TensorRule((Vd, H)),
        "d2t": TensorRule((Vd,), dtype="int64"),
        "t2d": TensorRule((V,), required=False, dtype="bool"),  # both engines skip it; kept for tools
        "embed_tokens.weight": TensorRule((V, H), required=False),
    }
    if c.get("bias"):  # SGLang builds fc with bias=config.bias
        out["fc.bias"] = TensorRule((H,))
    out.update(llama_layer_rules("midlayer.", c, 2 * H, input_norm=True))
    return out


def medusa_rules(c: dict[str, Any]) -> dict[str, TensorRule]:
    """vLLM Medusa: ResidualBlock ``layers`` with bias (medusa_fc_bias) and one lm_head per head."""
    H, V = c["hidden_size"], c.get("truncated_vocab_size") or c["vocab_size"]
    out: dict[str, TensorRule] = {}
    for i in range(c["num_heads"]):
        for j in range(c["num_hidden_layers"]):
            out[f"blocks.{i}.layers.{j}.weight"] = TensorRule((H, H))
            if c.get("medusa_fc_bias"):
                out[f"blocks.{i}.layers.{j}.bias"] = TensorRule((H,))
        out[f"lm_heads.{i}.weight"] = TensorRule((V, H))
    return out


LLAMA_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "vocab_size",
    "rms_norm_eps",
    "hidden_act",
    "max_position_embeddings",
)
EAGLE3_FIELDS = LLAMA_FIELDS + ("draft_vocab_size", "target_hidden_size")

FORMATS: dict[tuple[str, str], EngineFormat] = {
    ("vllm", "eagle"): EngineFormat(
        "vllm", "eagle", ["LlamaForCausalLM"], "llama", LLAMA_FIELDS, eagle1_rules(False, False)
    ),
    ("sglang", "eagle"): EngineFormat(
        "sglang", "EAGLE", ["LlamaForCausalLMEagle"], "llama", LLAMA_FIELDS, eagle1_rules(True, True)
    ),
    ("vllm", "eagle3"): EngineFormat(
        "vllm",
        "eagle3",
        ["LlamaForCausalLMEagle3"],
        "llama",
        EAGLE3_FIELDS + ("eagle_aux_hidden_state_layer_ids",),
        eagle3_rules,
        forbidden_config=("eagle_config", "bias"),  # vLLM's fc has no bias; nested ids mean layer outputs
    ),
    ("sglang", "eagle3"): EngineFormat(
        "sglang",
        "EAGLE3",
        ["LlamaForCausalLMEagle3"],
        "llama",
        EAGLE3_FIELDS + ("eagle_config",),
        eagle3_rules,
        forbidden_config=("eagle_aux_hidden_state_layer_ids",),
    ),
    ("vllm", "medusa"): EngineFormat(
        "vllm",
        "medusa",
        ["MedusaModel"],
        "medusa",
        ("hidden_size", "vocab_size", "num_heads", "num_hidden_layers", "medusa_fc_bias"),
        medusa_rules,
    ),
}


# ---- validation -------------------------------------------------------------------------------
def format_of(config: dict[str, Any], engine: str) -> EngineFormat:
    """The engine format that ``config`` declares (by model_type and architectures)."""
    arch = (config.get("architectures") or [None])[0]
    for (eng, _), fmt in FORMATS.items():
        if eng == engine and fmt.model_type == config.get("model_type") and fmt.architectures == [arch]:
            return fmt
    raise UserError(
        f"config.json (model_type {config.get('model_type')!r}, architectures {[arch]}) is not a {engine} "
        "drafter format draftheads knows"
    )


def _dtype_ok(t: torch.Tensor, family: str) -> bool:
    if family == "int64":
        return t.dtype == torch.int64
    if family == "bool":
        return t.dtype == torch.bool
    return t.is_floating_point()


def tensor_problems(tensors: dict[str, torch.Tensor], rules: dict[str, TensorRule]) -> list[str]:
    """Every way ``tensors`` differs from ``rules``: missing, unexpected, wrong shape or dtype."""
    problems = [f"missing {k}" for k, r in rules.items() if r.required and k not in tensors]
    problems += [f"unexpected {k} (the engine would skip it)" for k in tensors if k not in rules]
    for k, t in tensors.items():
        r = rules.get(k)
        if r is None:
            continue
        if tuple(t.shape) != r.shape:
            problems.append(f"{k} has shape {tuple(t.shape)}, the engine builds {r.shape}")
        elif not _dtype_ok(t, r.dtype):
            problems.append(f"{k} has dtype {t.dtype}, the engine expects {r.dtype}")
    return problems


def config_problems(config: dict[str, Any], fmt: EngineFormat) -> list[str]:
    """Missing or conflicting config fields for ``fmt``, including the EAGLE-3 aux-layer conventions."""
    problems = [f"config.json lacks {f}" for f in fmt.config_fields if config.get(f) is None]
    problems += [
        f"config.json must not set {f} for {fmt.engine}" for f in fmt.forbidden_config if f in config
    ]
    if fmt.method.lower() == "eagle3" and config.get("num_hidden_layers") != 1:
        problems.append("EAGLE-3 drafters have exactly one layer (num_hidden_layers: 1)")
    if fmt.model_type == "medusa" and config.get("medusa_fc_bias") is not True:
        problems.append("medusa_fc_bias must be true: Medusa ResBlocks have a bias")
    if fmt.engine == "sglang" and fmt.method == "EAGLE3":
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if not (isinstance(ids, list) and len(ids) == 3):
            problems.append("eagle_config.eagle_aux_hidden_state_layer_ids must list three layer ids")
    return problems


def validate_export(directory: str | os.PathLike, engine: str) -> EngineFormat:
    """Check an exported directory against the engine loader's spec; returns its format or raises."""
    directory = Path(directory)
    cfg_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not cfg_path.is_file() or not weights.is_file():
        raise UserError(f"{directory}: an engine drafter needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        config = json.loads(cfg_path.read_text())
        tensors = load_file(str(weights))
    except (json.JSONDecodeError, SafetensorError, OSError) as e:
        raise UserError(f"{directory}: unreadable export ({e})") from None
    fmt = format_of(config, engine)
    problems = config_problems(config, fmt)
    if not problems:
        problems = tensor_problems(tensors, fmt.tensors(config))
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UserError(f"{directory} does not match {engine} {fmt.method}: {'; '.join(problems[:3])}{more}")
    return fmt


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
    """EAGLE-1: our names are the official ones; vLLM builds fc without a bias, so a nonzero one is refused."""
    fp = drafter.target_fingerprint
    if drafter.feature_layers() != [fp.num_layers]:
        raise UserError(
            f"this EAGLE-1 drafter reads target layer {drafter.feature_layers()}; the engines feed it the "
            f"final normed hidden state (layer {fp.num_layers}) only"
        )
    sd = {k: v for k, v in drafter.state_to_save().items() if k != "embed_tokens.weight"}
    if engine == "vllm":
        bias = sd.pop("fc.bias")
        if bool(bias.ne(0).any()):
            raise UserError(
                f"vLLM builds the EAGLE fc layer without a bias and silently drops fc.bias, but this drafter's "
                f"bias is nonzero (max |b| = {bias.abs().max().item():.3g}); serve it with format=sglang, "
                "or train it with a zero fc bias"
            )
        return llama_config(drafter, ["LlamaForCausalLM"]), sd
    return llama_config(drafter, ["LlamaForCausalLMEagle"]), sd


def export_eagle3(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """EAGLE-3: ``layers.0.*`` -> ``midlayer.*``, ``hidden_norm`` -> ``midlayer.hidden_norm``; aux layer ids per engine."""
    fp = drafter.target_fingerprint
    if drafter.num_decoder_layers != 1:
        raise UserError(
            f"the engines' EAGLE-3 drafters have one layer; this one has {drafter.num_decoder_layers}"
        )
    layers = drafter.feature_layers()
    if not all(0 <= i < fp.num_layers for i in layers):
        raise UserError(
            f"feature layers {layers}: the engines capture layer inputs 0..{fp.num_layers - 1}; "
            f"layer {fp.num_layers} (the final normed state) cannot be served"
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
        cfg.update(eagle_aux_hidden_state_layer_ids=layers, norm_before_residual=False)
    else:
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers],
            "use_aux_hidden_state": True,
        }
    return cfg, sd


def export_medusa(drafter: Drafter, engine: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Medusa -> vLLM: ``blocks.{i}.{j}.linear`` -> ``blocks.{i}.layers.{j}``; shared heads get the target's lm_head."""
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
    if drafter.lm_head_mode == "shared":
        if "lm_head" not in drafter._shared:
            raise UserError(
                "these Medusa heads share the target's lm_head, which vLLM needs in the file; load the target "
                f"to export them (target=... for {fp.name})"
            )
        w = drafter.shared("lm_head").weight.detach().to("cpu")
        for i in range(drafter.num_heads):
            sd[f"lm_heads.{i}.weight"] = w.clone()
    cfg = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": fp.hidden_size,
        "vocab_size": fp.vocab_size,
        "num_heads": drafter.num_heads,
        "num_hidden_layers": drafter.num_layers,
        "medusa_fc_bias": True,
        "max_paths": 64,
        "topk": 10,
        "truncated_vocab_size": None,
    }
    return cfg, sd


def export_drafter(drafter: Drafter, engine: str, out: str | os.PathLike) -> Path:
    """Write ``drafter`` for ``engine`` into ``out`` (config.json + model.safetensors) and validate it.

    Shared-lm_head Medusa heads must be attached to their target (its lm_head is written).
    """
    engine = engine.lower()
    if engine not in ENGINES:
        raise UserError(f"format={engine} is not supported; use one of {', '.join(ENGINES)}")
    if drafter.kind == "medusa":
        cfg, sd = export_medusa(drafter, engine)
    elif drafter.version == 1:
        cfg, sd = export_eagle1(drafter, engine)
    else:
        cfg, sd = export_eagle3(drafter, engine)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sd.items()}
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    (out / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")
    validate_export(out, engine)
    return out


def serve_command(engine: str, method: str, target: str, draft: str, k: int = 3) -> str:
    """The command that serves ``target`` with the exported ``draft`` (also in docs/hub.md).

    SGLang's three tuning flags are left to its auto choice (set all three or none).
    """
    if engine == "vllm":
        spec = json.dumps({"method": method, "model": draft, "num_speculative_tokens": k})
        return f"vllm serve {target} --speculative-config '{spec}'"
    return (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm {method} "
        f"--speculative-draft-model-path {draft}"
    )


def needs_target(directory: Path) -> bool:
    """Official layouts (imported for a target) and shared-lm_head Medusa heads (their lm_head is written)."""
    from draftheads.heads.base import read_config
    from draftheads.heads.convert import detect_layout

    if detect_layout(directory) is not None:
        return True
    conf = read_config(directory)
    return conf["kind"] == "medusa" and conf["spec"].get("lm_head") == "shared"


def export(cfg) -> Path:
    """CLI entry: ``draftheads export heads=DIR format=vllm|sglang out=DIR [target=...]``."""
    from draftheads.heads.base import resolve_checkpoint_dir
    from draftheads.heads.target import load_target

    if not cfg.heads or not cfg.format or not cfg.out:
        raise UserError("draftheads export needs heads=DIR format=vllm|sglang out=DIR")
    engine = cfg.format.lower()
    if engine not in ENGINES:
        raise UserError(f"format={cfg.format} is not supported; use one of {', '.join(ENGINES)}")
    directory = resolve_checkpoint_dir(cfg.heads, cfg.revision)
    if needs_target(directory):
        target, tok = load_target(cfg.target)
        drafter = Drafter.from_pretrained(directory, target=target, tokenizer=tok)
    else:
        drafter = Drafter.from_pretrained(directory)
    out = export_drafter(drafter, engine, cfg.out)
    fmt = validate_export(out, engine)
    target_name = drafter.target_fingerprint.name
    if drafter.requires_adapters:
        target_name = "MERGED_TARGET"
        print(
            "note: these Medusa-2 heads were trained with LoRA adapters on the target; serve them with the "
            "target with those adapters merged (peft merge_and_unload), never with the plain target"
        )
    print(f"exported {drafter.kind} drafter to {out} ({engine} {fmt.method}); serve it with:")
    print("  " + serve_command(engine, fmt.method, target_name, str(out)))
    return out
