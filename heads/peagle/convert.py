"""speculators' ``peagle`` layout, both ways: a P-EAGLE drafter as ``PEagleDraftModel`` saves it.

speculators' P-EAGLE is its EAGLE-3 model (``Eagle3DraftModel``) plus ``mask_hidden`` and a
``mask_token_id``, and it trains its input embedding, so a checkpoint carries one::

    ours                          speculators
    fc.weight [H, 3H]             fc.weight
    hidden_norm.weight            layers.0.hidden_norm.weight
    layers.0.*                    layers.0.*             (q/k/v over 2H)
    norm, lm_head, d2t, t2d       the same (no d2t/t2d at the full vocabulary)
    input_norm / fc_norm.{i}      the same
    mask_hidden [1, 1, 3H]        mask_hidden
    mask_embed [H]                embed_tokens.weight = the target's embedding, row mask_token_id = it
    (own) embed_tokens.weight     embed_tokens.weight

and config.json is the eagle3 one (``transformer_layer_config``, ``draft_vocab_size``, the aux
layer ids, the norm flags) with ``speculators_model_type: peagle``, ``mask_token_id`` and a
``speculators_config`` whose greedy proposal drafts ``num_depths`` tokens. vLLM serves it with
``"parallel_drafting": true`` (it reads ``mask_token_id``, and fuses ``mask_hidden`` through fc
once). The EAGLE-3 part is written and read by the EAGLE-3 paths themselves
(:func:`~draftheads.heads.eagle.export.export_eagle3`,
:func:`~draftheads.heads.eagle.convert.eagle3_tensors`), so both kinds keep one set of checks.

On import, an embedding that is the target's outside the mask token's row becomes
``mask_embed``; any other (a speculators-trained one) is kept whole (``own_embedding``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.eagle.convert import (
    default_input_norm,
    eagle3_feature_layers,
    eagle3_norm_flags,
    eagle3_tensors,
    eagle_layers,
)
from draftheads.heads.eagle.export import export_eagle3
from draftheads.heads.eagle.speculators import eagle3_engine_config, eagle3_to_speculators
from draftheads.heads.files import atomic_write
from draftheads.heads.layouts import OfficialCheckpoint, read_tensors
from draftheads.heads.peagle.model import PEagleDrafter
from draftheads.heads.reduced_vocab import check_vocab_maps
from draftheads.heads.speculators import (
    check_section,
    check_verifier,
    full_layer_config,
    speculators_section,
)
from draftheads.heads.target.fingerprint import TargetFingerprint, fingerprint

ARCHITECTURE = "PEagleSpeculator"
OWN_ONLY = ("mask_embed", "embed_tokens.weight")  # our embedding parameters; written as embed_tokens


# ---- export ------------------------------------------------------------------------------------
def speculators_model(
    drafter: PEagleDrafter, section: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, tensors) of ``PEagleDraftModel`` for ``drafter``, ``section`` its
    ``speculators_config``: EAGLE-3's speculator with the mask token, the learned mask feature and
    the embedding the drafter reads."""
    engine_cfg, sd = export_eagle3(drafter, "vllm")
    sd = {k: v for k, v in sd.items() if k not in OWN_ONLY}
    cfg, tensors = eagle3_to_speculators(engine_cfg, sd, section)
    tensors["embed_tokens.weight"] = drafter.input_embedding().to(drafter.fc.weight.dtype).contiguous()
    cfg.update(
        architectures=[ARCHITECTURE],
        speculators_model_type="peagle",
        mask_token_id=drafter.mask_token_id,
        embed_requires_grad=True,
    )
    return cfg, tensors


def to_speculators(
    drafter: PEagleDrafter, verifier: str | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, tensors) of ``PEagleDraftModel`` for ``drafter``, whose greedy proposal drafts
    its ``num_depths``; ``verifier`` is the model name the engine loads (default: the target's)."""
    fp = drafter.target_fingerprint
    section = speculators_section("peagle", drafter.num_depths, verifier or fp.name, fp.architecture)
    return speculators_model(drafter, section)


def write_speculators(drafter: PEagleDrafter, out: str | Path, verifier: str | None = None) -> Path:
    """Write ``out/config.json`` and ``out/model.safetensors`` (each atomically)."""
    cfg, tensors = to_speculators(drafter, verifier)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write(
        folder / "model.safetensors", lambda p: save_file(tensors, str(p), metadata={"format": "pt"})
    )
    atomic_write(folder / "config.json", lambda p: p.write_text(json.dumps(cfg, indent=2) + "\n"))
    return folder


# ---- import ------------------------------------------------------------------------------------
def proposal_tokens(config: dict[str, Any], where: str) -> int:
    """The default proposal method's ``speculative_tokens``: the group size it was trained for."""
    section = config["speculators_config"]
    method = next(
        m for m in section["proposal_methods"] if m.get("proposal_type") == section["default_proposal_method"]
    )
    tokens = method.get("speculative_tokens")
    if not isinstance(tokens, int) or tokens < 1:
        raise UserError(
            f"{where}: speculative_tokens={tokens!r}; a peagle speculator drafts at least one token"
        )
    return tokens


def mask_token(config: dict[str, Any], vocab: int, where: str) -> int:
    """``mask_token_id``: a token id of the target's vocabulary."""
    mask = config.get("mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < vocab:
        raise UserError(
            f"{where}: mask_token_id={mask!r} is not a token id of the target (0..{vocab - 1}); "
            "a peagle speculator needs the token its mask positions read"
        )
    return mask


def split_embedding(
    emb: torch.Tensor | None, target: nn.Module, mask: int
) -> tuple[bool, dict[str, torch.Tensor]]:
    """(own_embedding, tensors): the mask token's row alone when the rest is the target's
    embedding (or there is none), else the whole table."""
    own = target.get_input_embeddings().weight.detach().to("cpu", torch.float32)
    if emb is None:
        return False, {"mask_embed": own[mask].clone()}
    rest = torch.ones(own.shape[0], dtype=torch.bool)
    rest[mask] = False
    if tuple(emb.shape) == tuple(own.shape) and torch.allclose(
        emb[rest].float(), own[rest], rtol=1e-2, atol=1e-3
    ):
        return False, {"mask_embed": emb[mask].clone()}
    return True, {"embed_tokens.weight": emb}


def from_speculators(
    config: dict[str, Any], sd: dict[str, torch.Tensor], target: nn.Module, fp: TargetFingerprint, where: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(PEagleDrafter arguments, tensors under our names) of a peagle speculator for ``target``.

    Refused in one line: another speculators type, an incomplete ``speculators_config``, a
    decoder of several layers, a mask token outside the vocabulary, missing tensors."""
    if config.get("speculators_model_type") != "peagle":
        raise UserError(
            f"{where}: speculators_model_type is {config.get('speculators_model_type')!r}, not 'peagle'"
        )
    check_section(config.get("speculators_config"), where)
    engine = eagle3_engine_config(
        config, full_layer_config(config.get("transformer_layer_config") or {}, where), where
    )
    mask = mask_token(config, fp.vocab_size, where)
    sd = dict(sd)
    missing = [k for k in ("mask_hidden", "lm_head.weight", "fc.weight") if k not in sd]
    if missing:
        raise UserError(
            f"{where}: a peagle speculator needs {', '.join(missing)}; the checkpoint is incomplete"
        )
    own, embedding = split_embedding(sd.pop("embed_tokens.weight", None), target, mask)
    lm = sd["lm_head.weight"]
    if "d2t" not in sd and lm.shape[0] == fp.vocab_size:  # a full vocabulary has no maps there
        sd["d2t"] = torch.zeros(fp.vocab_size, dtype=torch.long)
    if "d2t" not in sd:
        raise UserError(
            f"{where}: a reduced-vocabulary peagle speculator needs d2t; the checkpoint is incomplete"
        )
    tensors = {**eagle3_tensors(sd, fp.vocab_size), **embedding}
    default_input_norm(tensors, eagle3_norm_flags(engine), where)
    check_vocab_maps(tensors["d2t"], tensors["t2d"], fp.vocab_size, where)
    spec = {
        **eagle_layers(target, engine, 1),
        "mask_token_id": mask,
        "num_depths": proposal_tokens(config, where),
        "num_decoder_layers": 1,
        "feature_layers": eagle3_feature_layers(engine),
        "draft_vocab_size": int(lm.shape[0]),
        "own_embedding": own,
        **eagle3_norm_flags(engine),
    }
    return spec, tensors


def build_peagle(
    ckpt: OfficialCheckpoint, target: nn.Module, fp: TargetFingerprint
) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """A speculators ``peagle`` directory (found by :mod:`~draftheads.heads.layouts`) -> (``"peagle"``,
    PEagleDrafter arguments, tensors under our names); the verifier was checked by the caller."""
    spec, tensors = from_speculators(ckpt.source_config, read_tensors(ckpt.files), target, fp, ckpt.where())
    return "peagle", spec, tensors


def load_speculators(folder: str | Path, target: nn.Module, tokenizer: Any = None) -> PEagleDrafter:
    """A peagle speculator folder as a :class:`PEagleDrafter` attached to ``target`` (its verifier)."""
    folder = Path(folder)
    where = str(folder)
    config = json.loads((folder / "config.json").read_text())
    fp = fingerprint(target, tokenizer)
    check_verifier(config, fp.name, fp.architecture, where)
    spec, tensors = from_speculators(config, load_file(str(folder / "model.safetensors")), target, fp, where)
    drafter = PEagleDrafter(fp, **spec)
    drafter.load_checked(tensors, where)
    return drafter.attach(target)
