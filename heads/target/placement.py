"""Sharding a target too big for one device (``target.device_map``, ``max_memory``, ``offload_folder``).

accelerate shards it: the placement is worked out on an empty (meta) copy of the model and
checked before any weight is read (see :func:`device_map_for`), then ``from_pretrained`` (or,
for a tiny target, ``dispatch_model``) places the modules. Accelerate's hooks move activations
between devices and bring offloaded weights in for each call; the outputs come back on the
device of the inputs. The input embedding and the lm_head, which drafters share, stay resident.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TargetConfig, memory_bytes
from draftheads.heads.target.layers import decoder_layers


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
