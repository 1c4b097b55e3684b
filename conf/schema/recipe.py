"""Typed config of a recipe (Hydra group ``recipe/``): the devices a real run needs and the
real target's shape.

A recipe file sets the target, drafter, data, training and DeepSpeed keys of one real run
(``conf/recipe/*.yaml``) and carries this block beside them. ``shape`` holds the numbers of the
target's ``config.json``, so that ``train.dry_run=true`` sizes the real run (parameters,
memory per rank, FLOPs per token) without downloading the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.checks import at_least

SHAPE_SIZES = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size",
)  # fmt: skip


@dataclass
class TargetShape:
    """The real target's architecture, as its ``config.json`` names it (0: not given)."""

    model_type: str = ""
    hidden_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    # null: hidden_size // num_attention_heads
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    # the family's other config.json keys that size it: experts (num_experts, num_experts_per_tok,
    # moe_intermediate_size, ...), sliding windows, layer types
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        """Whether the shape is filled in (a recipe's) rather than left at its defaults."""
        return bool(self.model_type) or any(getattr(self, k) for k in SHAPE_SIZES)

    @property
    def attention_dim(self) -> int:
        """Query width, heads x head_dim."""
        return self.num_attention_heads * (self.head_dim or self.hidden_size // self.num_attention_heads)

    def config_dict(self) -> dict:
        """The keys a transformers config of ``model_type`` takes (no model_type itself)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("model_type", "extra")}
        if out["head_dim"] is None:
            out.pop("head_dim")
        return {**out, **dict(self.extra)}

    def __post_init__(self) -> None:
        """A shape is all there or not at all: a dry run cannot size a run from half of one."""
        if not self.given:
            return
        missing = [k for k in SHAPE_SIZES if getattr(self, k) < 1]
        if not self.model_type or missing:
            what = ", ".join((["model_type"] if not self.model_type else []) + missing)
            raise UserError(
                f"recipe.shape lacks {what}; give every number of the target's config.json "
                "(model_type, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, "
                "intermediate_size, vocab_size)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(
                f"recipe.shape.num_key_value_heads={self.num_key_value_heads} does not divide "
                f"num_attention_heads={self.num_attention_heads}; copy both from the target's config.json"
            )
        at_least("recipe.shape.head_dim", self.head_dim, 1, 128)
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"recipe.shape.hidden_size={self.hidden_size} is not a multiple of "
                f"recipe.shape.num_attention_heads={self.num_attention_heads}, so the heads have no width; "
                "copy both from the target's config.json (and head_dim, if it has one)"
            )


@dataclass
class RecipeConfig:
    """One real run's needs: ``devices`` GPUs (one process each, or, when ``target.device_map``
    is set, one process whose target spans them) and the real target's ``shape``."""

    name: str | None = None
    devices: int = 1
    shape: TargetShape = field(default_factory=TargetShape)

    def __post_init__(self) -> None:
        """Refuse a recipe that asks for no device."""
        at_least("recipe.devices", self.devices, 1, 8)
