"""The drafter-kind registry: what each kind of drafter is, beside its model, in one place.

A kind (``medusa``, ``eagle``, ``dflash``) lives in its own folder, ``heads/<kind>/``:

* ``model.py``: the :class:`~draftheads.heads.base.Drafter` subclass (``kind = "<kind>"``);
* ``convert.py``: converters from the published layouts (``layout -> (kind, spec, tensors)``);
* ``engine.py``: what vLLM's and SGLang's loaders read (``FORMATS``, ``RULES``, see
  :mod:`~draftheads.heads.engine.spec`);
* ``export.py``: the engines' layout of the drafter (config and tensors);
* ``kind.py``: a :class:`DrafterKind` subclass decorated with :func:`register_kind`, holding the
  facts generic code asks for: how to build the drafter from a ``DraftConfig``, its published
  layouts, its engine formats and rules, its export, its model-card lines;
* ``__init__.py``: re-exports the model and imports ``kind`` (the registration).

:mod:`draftheads.heads` imports every kind folder, so importing anything under it fills the
registry. Generic code never tests a kind's name: it calls :func:`drafter_kind` (one clear
:class:`~draftheads.conf.errors.UserError` for an unknown kind, naming the known ones) and asks
the facts. The other layers keep their own registries, by the same pattern: the config keys and
checks per kind (:mod:`draftheads.conf.schema.kinds`), the training objective per kind
(:func:`draftheads.train.modules.register_objective`) and the decoding proposer per kind
(:func:`draftheads.decode.proposers.register_proposer`). ``docs/kinds.md`` walks through adding one.

The card and export facts read a checkpoint's ``config.json`` dict (``conf``: ``kind``, ``spec``,
``target``, ``requires_adapters``), so they answer without building the drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from draftheads.conf.errors import UserError

if TYPE_CHECKING:  # named in annotations only: the registry imports no other heads module
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.heads.engine.spec import EngineFormat, Rule

# The registry sits below every other heads module (they import it, it imports none of them), so
# the drafter, a published checkpoint and a target fingerprint are typed loosely here.
Drafter = nn.Module
Converted = tuple[str, dict[str, Any], dict[str, torch.Tensor]]  # (kind, spec, tensors)
# (published checkpoint, target, target fingerprint) -> our kind, constructor arguments, tensors
Converter = Callable[[Any, nn.Module, Any], Converted]
Export = tuple[dict[str, Any], dict[str, torch.Tensor]]  # (config.json, tensors)

KINDS: dict[str, DrafterKind] = {}


class DrafterKind:
    """The facts of one drafter kind; subclass it in ``heads/<kind>/kind.py`` with :func:`register_kind`.

    Class attributes name the kind and its pieces; methods answer for one drafter (built, or
    its ``config.json`` dict ``conf``). Defaults suit a kind that no engine serves.
    """

    name: ClassVar[str] = ""
    drafter: ClassVar[type[Drafter]]
    # published layout name (as heads.layouts detects it) -> converter to our kind, spec, tensors
    layouts: ClassVar[dict[str, Converter]] = {}
    # (engine, method) -> what that engine's loader reads; the loaders' further rules
    formats: ClassVar[dict[tuple[str, str], EngineFormat]] = {}
    rules: ClassVar[tuple[Rule, ...]] = ()
    # the engines serve it with any number of drafted tokens a step (EAGLE's chain), not only its own
    any_chain: ClassVar[bool] = False
    # the speculators_model_type this kind is written as (None: speculators has none)
    speculators_type: ClassVar[str | None] = None
    # the engine layout (as heads.layouts names it) whose tensors speculators' layout of this kind
    # holds under other names, read through that layout's converter (None: the kind converts
    # speculators' own layout, registered in ``layouts`` under ``speculators_type``)
    speculators_engine_layout: ClassVar[str | None] = None
    # "EAGLE-{version}", "DFlash (block {block_size})": the kind as one phrase, from DraftConfig fields
    title: ClassVar[str] = ""

    # ---- building --------------------------------------------------------------------------
    def build(self, d: DraftConfig, fp: Any, target_config: dict[str, Any], tokenizer: Any) -> Drafter:
        """The untrained drafter ``d`` describes for the target (``target_config``: its HF config dict)."""
        raise NotImplementedError

    # ---- model card ------------------------------------------------------------------------
    def num_speculative_tokens(self, conf: dict[str, Any]) -> int:
        """``num_speculative_tokens`` an engine serves the drafter with."""
        raise NotImplementedError

    def tags(self, conf: dict[str, Any]) -> list[str]:
        """Hub tags beside ``speculative-decoding``, the kind and ``draftheads``."""
        return []

    def describe(self, conf: dict[str, Any]) -> str:
        """One line: what this drafter is."""
        return f"a {self.name} drafter"

    def engine_methods(self, conf: dict[str, Any]) -> list[tuple[str, str]]:
        """(engine, method) pairs that serve the drafter."""
        return []

    def sglang_refusal(self, conf: dict[str, Any]) -> str | None:
        """Why SGLang cannot serve the drafter, or None when it can."""
        return f"SGLang does not serve {self.name} drafters; use the draftheads decoder."

    def speculators_refusal(self, conf: dict[str, Any]) -> str | None:
        """Why speculators' format cannot hold the drafter, or None when it can."""
        if self.speculators_type is None:
            return (
                f"speculators has no model type for {self.describe_short(conf)} (it defines eagle3 and "
                "dflash drafters); export it with format=vllm"
            )
        return None

    def describe_short(self, conf: dict[str, Any]) -> str:
        """The drafter in a few words, for refusals."""
        return f"a {self.name} drafter"

    def export_refusal(self, conf: dict[str, Any], engine: str) -> str | None:
        """Why ``engine`` (``vllm``, ``sglang``, ``speculators``) cannot take the drafter, known
        before the target is loaded, or None."""
        return self.speculators_refusal(conf) if engine == "speculators" else None

    def export_needs_target(self, conf: dict[str, Any]) -> bool:
        """Whether an export writes some of the target's weights (so the target must be loaded)."""
        return False

    # ---- export ----------------------------------------------------------------------------
    def export(self, drafter: Drafter, engine: str) -> Export:
        """The drafter in ``engine``'s layout (``vllm`` or ``sglang``)."""
        raise UserError(f"{self.name} drafters cannot be exported for {engine}; decode them with draftheads")

    def to_speculators(self, drafter: Drafter, section: dict[str, Any]) -> Export:
        """The drafter in speculators' layout, ``section`` its ``speculators_config``."""
        raise UserError(self.speculators_refusal({"kind": self.name, "spec": drafter.spec()}) or "")

    # ---- import ----------------------------------------------------------------------------
    def import_problem(self, spec: dict[str, Any], tokenizer: Any, origin: str) -> str | None:
        """Why an imported drafter's arguments ``spec`` cannot serve with ``tokenizer`` (checked as
        our training checks the same setting), naming the field as the file of ``origin``
        (``speculators`` or an official layout) writes it; None when they can."""
        return None

    def engine_config_from_speculators(
        self, config: dict[str, Any], layers: dict[str, Any], where: str
    ) -> dict[str, Any]:
        """A speculators ``config`` of this kind as its engine layout's config (``layers``: its
        ``transformer_layer_config`` with the class defaults filled in); only asked of a kind with a
        ``speculators_engine_layout``."""
        raise NotImplementedError


def register_kind(cls: type[DrafterKind]) -> type[DrafterKind]:
    """Class decorator: register one instance of ``cls`` under ``cls.name`` (a name is taken once)."""
    if not cls.name or cls.name in KINDS:
        raise ValueError(f"drafter kind {cls.name!r} is empty or registered twice")
    KINDS[cls.name] = cls()
    return cls


def drafter_kind(name: str, where: str = "drafter kind") -> DrafterKind:
    """The registered kind ``name``; one clear error naming the known kinds otherwise."""
    if name not in KINDS:
        raise UserError(f"{where} {name!r} is unknown; draftheads knows {', '.join(sorted(KINDS))}")
    return KINDS[name]


def layout_kind(layout: str) -> tuple[DrafterKind, Converter]:
    """The kind that reads the published ``layout``, and its converter."""
    for kind in KINDS.values():
        if layout in kind.layouts:
            return kind, kind.layouts[layout]
    raise UserError(
        f"no drafter kind reads the layout {layout!r}; draftheads knows {', '.join(sorted(KINDS))}"
    )
