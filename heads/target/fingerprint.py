"""The fingerprint that ties a drafter to its target: shape, tokenizer hash and a weight sample.

A drafter records the fingerprint of the target it was trained on; loading it on another target
compares the two (:meth:`TargetFingerprint.check_compatible`) and refuses a mismatch in one line.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import asdict, dataclass

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.heads.target.layers import decoder_layers
from draftheads.heads.target.placement import onloaded


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
    LoRA adapter weights are skipped, so a target carrying the adapters its heads were trained with
    matches its base.
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


# tokenizer -> (what its hash read besides the vocabulary, the hash): a vocabulary of 49k
# entries takes a fifth of a second to hash, and one process fingerprints one tokenizer often
_HASHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tokenizer_hash(tokenizer) -> str:
    """sha256 over the vocabulary, the special tokens and the chat template.

    Remembered per tokenizer object while its size, special tokens and template stay the same
    (the vocabulary only changes through added tokens, which change its size)."""
    special = list(getattr(tokenizer, "all_special_tokens", []) or [])
    template = getattr(tokenizer, "chat_template", None) or ""
    key = (len(tokenizer), tuple(special), template)
    try:
        seen = _HASHED.get(tokenizer)
    except TypeError:  # an object that takes no weak reference: hash it every time
        seen = None
    if seen is not None and seen[0] == key:
        return seen[1]
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    h.update(json.dumps(special).encode())
    h.update(template.encode())
    digest = h.hexdigest()
    try:
        _HASHED[tokenizer] = (key, digest)
    except TypeError:
        pass
    return digest


def share_hash(original, copy) -> None:
    """Let ``copy`` (a deep copy of tokenizer ``original``) reuse ``original``'s hash, computed
    once; the size, special tokens and template are checked again on use, so a later change to
    the copy is hashed anew."""
    tokenizer_hash(original)
    try:
        _HASHED[copy] = _HASHED[original]
    except (TypeError, KeyError):
        pass


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
