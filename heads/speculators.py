"""vLLM's ``speculators`` format: drafters of the kinds that speculators defines, as its classes hold them.

A speculators directory is ``config.json`` + ``model.safetensors``. The config is the drafter
model's own (``speculators_model_type``, ``architectures``, a ``transformer_layer_config``
describing its decoder layers, and the type's fields) plus a ``speculators_config``: the
``algorithm``, the ``proposal_methods`` (``greedy`` with ``speculative_tokens``), the
``default_proposal_method`` and the ``verifier`` (``name_or_path``, ``architectures``).
``vllm serve DIR`` reads the speculative settings from it, so the directory needs no flags.

Each kind that speculators defines writes and reads its type in its own folder
(``heads/<kind>/speculators.py``: the type's fields and tensors; ``docs/hub.md`` tabulates them).
Layer ids index the target's ``hidden_states`` (id ``i`` is the input of layer ``i``), as
draftheads' ``feature_layers`` do. The embedding (and a full-vocabulary lm_head) is the
verifier's, never stored.

This module translates between that layout and the engine layouts the rest of
:mod:`draftheads.heads` already writes (:mod:`~draftheads.heads.export`) and reads
(:mod:`~draftheads.heads.convert.official`), so an import checks every tensor exactly as those paths
do. Which types draftheads reads is the kinds' to say (``DrafterKind.speculators_type``):
a kind whose speculators layout is an engine layout's tensors under other names says which
(``DrafterKind.speculators_engine_layout``), a kind that reads speculators' own layout converts
it under its type. The types draftheads cannot run (:data:`UNMAPPED`) are refused naming the
type and why.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TINY_KINDS
from draftheads.heads.kinds import KINDS
from draftheads.heads.target.fingerprint import SAMPLES_PER_TENSOR, TargetFingerprint, samples_match

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config and model classes this follows
PROPOSAL = "greedy"  # the only proposal method speculators defines: one chain of drafted tokens
UNMAPPED = {
    "dflash2": "its sliding-window layers attend causally inside the block",
    "dspark": "it samples from the anchor and adds Markov and confidence heads",
    "xpress": "its drafter has no draftheads counterpart",
    "mtp": "it reuses the target's own multi-token-prediction layers",
}
EAGLE3_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# Keys of an engine-layout config that are the drafter's, not its decoder layers'.
NOT_LAYER_KEYS = (
    "architectures",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    *EAGLE3_FLAGS,
    "block_size",
    "num_target_layers",
    "dflash_config",
)


# ---- export ------------------------------------------------------------------------------------
def speculators_section(algorithm: str, tokens: int, verifier: str, architecture: str) -> dict[str, Any]:
    """The ``speculators_config``: one greedy chain of ``tokens`` drafted tokens, for ``verifier``."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [
            {
                "proposal_type": PROPOSAL,
                "speculative_tokens": tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": PROPOSAL,
        "verifier": {"name_or_path": verifier, "architectures": [architecture]},
    }


def layer_config(engine_cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``transformer_layer_config``: an engine-layout config without the drafter's own keys."""
    return {k: v for k, v in engine_cfg.items() if k not in NOT_LAYER_KEYS}


# ---- import ------------------------------------------------------------------------------------
def is_speculators_config(config: dict[str, Any]) -> bool:
    """True for a speculators ``config.json``: it names a ``speculators_model_type``."""
    return "speculators_model_type" in config


def readable_types() -> list[str]:
    """The speculators types draftheads reads: those of the kinds."""
    return sorted(k.speculators_type for k in KINDS.values() if k.speculators_type)


def speculators_layout(config: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    """(our layout, the config its converter reads) of a speculators config, checked first: an
    engine layout and its config for the types read that way (the owning kind's
    ``speculators_engine_layout``), else the
    type itself and the speculators config, which the kind that lists it converts.

    Refused in one line: a type no kind reads (named, with why where known), a
    ``speculators_config`` whose default proposal method it does not define, and drafter
    options draftheads lacks.
    """
    kind = config.get("speculators_model_type")
    readable = ", ".join(readable_types())
    if kind in UNMAPPED:
        raise UserError(
            f"{where}: speculators_model_type {kind!r} cannot be run by draftheads ({UNMAPPED[kind]}); "
            f"draftheads reads {readable} speculators"
        )
    if kind not in readable_types():
        raise UserError(
            f"{where}: unknown speculators_model_type {kind!r}; draftheads reads {readable} speculators "
            f"(and refuses {', '.join(UNMAPPED)})"
        )
    check_section(config.get("speculators_config"), where)
    owner = next(k for k in KINDS.values() if k.speculators_type == kind)
    if owner.speculators_engine_layout is None:
        return kind, config
    layers = full_layer_config(config.get("transformer_layer_config") or {}, where)
    return owner.speculators_engine_layout, owner.engine_config_from_speculators(config, layers, where)


def check_section(section: Any, where: str) -> None:
    """A ``speculators_config`` with a verifier and a default proposal method it defines."""
    if not isinstance(section, dict) or not isinstance(section.get("verifier"), dict):
        raise UserError(
            f"{where}: config.json has no speculators_config with a verifier; it is not a complete "
            "speculators checkpoint"
        )
    methods = [m.get("proposal_type") for m in section.get("proposal_methods") or [] if isinstance(m, dict)]
    default = section.get("default_proposal_method")
    if default not in methods:
        raise UserError(
            f"{where}: speculators_config.default_proposal_method {default!r} is not one of its "
            f"proposal_methods {methods}; set it to one of them"
        )


def full_layer_config(given: dict[str, Any], where: str) -> dict[str, Any]:
    """``transformer_layer_config`` with its class defaults filled in, as speculators reads it
    (it is saved as a diff against its class: Qwen3 unless ``model_type`` says otherwise)."""
    from transformers import AutoConfig

    model_type = given.get("model_type", "qwen3")
    try:
        full = AutoConfig.for_model(model_type, **{k: v for k, v in given.items() if k != "model_type"})
    except Exception as e:  # transformers' and huggingface_hub's validators raise many types
        detail = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        raise UserError(
            f"{where}: transformer_layer_config is not a valid {model_type} config ({detail[-1][:200]}); "
            "it is damaged"
        ) from None
    return full.to_dict()


def same_model(name: str, other: str) -> bool:
    """Whether two model names are one model: equal, or the same final path component (a Hub id
    and a local copy of it)."""
    a, b = name.rstrip("/"), other.rstrip("/")
    return a == b or PurePosixPath(a).name.lower() == PurePosixPath(b).name.lower()


def check_verifier(config: dict[str, Any], name: str, architecture: str, where: str) -> None:
    """The speculator's verifier must be the target: same name (or final path component) and
    architecture. Another verifier is refused, naming it."""
    verifier = config["speculators_config"]["verifier"]
    wanted = verifier.get("name_or_path") or ""
    archs = verifier.get("architectures") or []
    if (wanted and not same_model(wanted, name)) or (archs and architecture not in archs):
        raise UserError(
            f"{where}: its verifier is {wanted or '?'} ({', '.join(archs) or 'any architecture'}), but the "
            f"target is {name} ({architecture}); load it with its verifier: {verifier_override(wanted)}"
        )


def verifier_override(name: str) -> str:
    """The command-line override that loads the target named ``name``: the config group of a tiny
    target or of the embedded SmolLM2, else ``target.name_or_path`` (a hub id or a folder)."""
    if name in {f"tiny-{kind}" for kind in TINY_KINDS}:
        return f"target={name}"
    if name == "HuggingFaceTB/SmolLM2-135M-Instruct":
        return "target=smollm2"
    return f"target.name_or_path={name or 'ORG/NAME'}"


# ---- the verifier a user serves with -------------------------------------------------------------
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight")


def weight_names(folder: Path) -> list[str]:
    """The tensor names of a model folder's safetensors weights (one file or an index)."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text())["weight_map"])
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return list(f.keys())


def read_tensor(folder: Path, name: str) -> torch.Tensor:
    """One tensor of a model folder's safetensors weights, read alone."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    file = json.loads(index.read_text())["weight_map"][name] if index.is_file() else "model.safetensors"
    with safe_open(str(folder / file), framework="pt") as f:
        return f.get_tensor(name)


def verifier_problem(folder: Path, fp: TargetFingerprint) -> str | None:
    """How the model in ``folder`` differs from the drafter's target ``fp`` (shape, architecture,
    tokenizer, the embedding's weight sample), or why an engine cannot load it (no model class
    named, no embedding); None when it is the target."""
    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads.target.fingerprint import _spread, tokenizer_hash
    from draftheads.heads.target.load import load_tokenizer

    try:
        config = json.loads((folder / "config.json").read_text())
        names = weight_names(folder)
    except (OSError, ValueError, KeyError) as e:
        return f"it is no model folder with config.json and safetensors weights ({type(e).__name__})"
    got = {
        "model_type": config.get("model_type"),
        "hidden_size": config.get("hidden_size"),
        "num_layers": config.get("num_hidden_layers"),
        "vocab_size": config.get("vocab_size"),
    }
    bad = [
        f"{k} {got[k]} (target: {getattr(fp, k)})" for k in got if getattr(fp, k) and got[k] != getattr(fp, k)
    ]
    if bad:
        return f"it is another model: {', '.join(bad)}"
    if not config.get("architectures"):
        return (
            "its config.json names no architectures, so vLLM resolves its model class by model_type alone "
            "(LlamaModel, an embedding model, for llama) and the export would name no verifier class; save it "
            "with transformers' save_pretrained, which names them"
        )
    embedding = next((n for n in names if n.endswith(EMBEDDING_SUFFIXES)), None)
    if embedding is None:
        return (
            "its weights hold no input embedding (model.embed_tokens.weight), which vLLM then leaves "
            "uninitialised; save it with transformers' save_pretrained"
        )
    sample = tuple(round(v, 6) for v in _spread(read_tensor(folder, embedding), SAMPLES_PER_TENSOR))
    if fp.weight_sample and not samples_match(sample, fp.weight_sample[:SAMPLES_PER_TENSOR]):
        return "its embedding weights are not the target's (another model of the same shape)"
    if fp.tokenizer_hash:
        try:
            tok = load_tokenizer(TargetConfig(name_or_path=str(folder)))
        except UserError:
            return "it has no tokenizer that transformers can load"
        if tokenizer_hash(tok) != fp.tokenizer_hash:
            return "its tokenizer is not the target's"
    return None


def check_verifier_folder(path: str, fp: TargetFingerprint) -> str:
    """The verifier a speculators export names (``verifier=PATH``): a local copy of the drafter's
    target, which the engine loads from there instead of the Hub. Returns its absolute path;
    a missing folder or another model is refused in one line."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"verifier={path} does not exist; pass the folder of the target model the engine serves "
            f"({fp.name}: its config.json, weights and tokenizer)"
        )
    problem = verifier_problem(folder, fp)
    if problem:
        raise UserError(
            f"verifier={path} cannot serve this drafter: {problem}; pass a local copy of its target {fp.name}"
        )
    return str(folder.resolve())
