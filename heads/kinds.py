"""The heads facts of each drafter kind: what each kind of drafter is, beside its model, in one place.

A kind (one record of ``draftheads.conf.schema.kinds.BUILTIN_KINDS``) lives in its own folder,
``heads/<kind>/``:

* ``model.py``: the :class:`~draftheads.heads.base.Drafter` subclass (``kind = "<kind>"``);
* ``convert.py``: converters from the published layouts (``layout -> (kind, spec, tensors)``);
* ``engine.py``: what vLLM's and SGLang's loaders read (``FORMATS``, ``RULES``, see
  :mod:`~draftheads.heads.engine.spec`);
* ``export.py``: the engines' layout of the drafter (config and tensors);
* ``kind.py``: a :class:`DrafterKind` subclass holding the facts generic code asks for: how to
  build the drafter from a ``DraftConfig``, its published layouts and how a checkpoint of them is
  recognised, its engine formats and rules, its export, its model-card lines;
* ``__init__.py``: re-exports the model and the kind.

The kind's record (:class:`~draftheads.conf.schema.kinds.record.KindRecord`, in
``conf/schema/kinds/<kind>.py``) names that class by dotted path, beside the kind's config
section, objective, proposer and bench rows; :data:`KINDS` is read from the records of
:data:`~draftheads.conf.schema.kinds.BUILTIN_KINDS` when first asked, so nothing registers by
being imported. Generic code never tests a kind's name: it calls :func:`drafter_kind` (one clear
:class:`~draftheads.conf.errors.UserError` for an unknown kind, naming the known ones) and asks
the facts. ``docs/kinds.md`` walks through adding one.

The card and export facts read a checkpoint's ``config.json`` dict (``conf``: ``kind``, ``spec``,
``target``, ``requires_adapters``), so they answer without building the drafter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds import BUILTIN_KINDS, kind_record

if TYPE_CHECKING:  # named in annotations only: this module imports no other heads module
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.heads.engine.spec import EngineFormat, Rule

# This module sits below every other heads module (they import it, it imports none of them), so
# the drafter, a published checkpoint and a target fingerprint are typed loosely here.
Drafter = nn.Module
Converted = tuple[str, dict[str, Any], dict[str, torch.Tensor]]  # (kind, spec, tensors)
# (published checkpoint, target, target fingerprint) -> our kind, constructor arguments, tensors
Converter = Callable[[Any, nn.Module, Any], Converted]
Export = tuple[dict[str, Any], dict[str, torch.Tensor]]  # (config.json, tensors)


class DrafterKind:
    """The facts of one drafter kind; subclass it in ``heads/<kind>/kind.py`` and name it in the kind's record.

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
    # the engines serve it with any number of drafted tokens a step (it drafts a chain), not only its own
    any_chain: ClassVar[bool] = False
    # the speculators_model_type this kind is written as (None: speculators has none)
    speculators_type: ClassVar[str | None] = None
    # the engine layout (as heads.layouts names it) whose tensors speculators' layout of this kind
    # holds under other names, read through that layout's converter (None: the kind converts
    # speculators' own layout, listed in ``layouts`` under ``speculators_type``)
    speculators_engine_layout: ClassVar[str | None] = None
    # the kind as one phrase, a format string over DraftConfig fields (e.g. "<Name> ({num_heads} heads)")
    title: ClassVar[str] = ""
    # the files or tensors that mark its published layouts, named when a folder holds no known layout
    layout_hint: ClassVar[str] = ""

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
                f"speculators has no model type for {self.describe_short(conf)} ({speculators_types()}); "
                "export it with format=vllm"
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
        raise UserError(self.speculators_refusal(drafter.kind_config()) or "")

    # ---- import ----------------------------------------------------------------------------
    def detect_files(self, directory: Path, config: dict[str, Any]) -> Any | None:
        """The official checkpoint of this kind in ``directory`` that its files or its
        ``config.json`` dict ``config`` mark (a :class:`~draftheads.heads.layouts.OfficialCheckpoint`),
        or None; asked before any tensor name is read."""
        return None

    def classify_keys(self, keys: list[str], files: list[Path]) -> str | None:
        """The published layout of this kind that a full checkpoint's tensor names ``keys`` (in
        ``files``) imply, or None."""
        return None

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


class BuiltinKinds(Mapping[str, "DrafterKind"]):
    """Kind name -> its :class:`DrafterKind`, one instance per record of ``BUILTIN_KINDS``, loaded on
    first use (the kinds' modules import this one, so they cannot be loaded while it is)."""

    def __init__(self) -> None:
        self._kinds: dict[str, DrafterKind] | None = None

    def _loaded(self) -> dict[str, DrafterKind]:
        if self._kinds is None:
            kinds = {record.name: record.heads_facts()() for record in BUILTIN_KINDS}
            wrong = [name for name, kind in kinds.items() if kind.name != name]
            if wrong:
                raise ValueError(f"the heads facts of kind(s) {wrong} name another kind")
            self._kinds = kinds
        return self._kinds

    def __getitem__(self, name: str) -> DrafterKind:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


KINDS: Mapping[str, DrafterKind] = BuiltinKinds()


def speculators_types() -> str:
    """The speculators model types draftheads writes, as refusals name them: "it defines A, B and
    C drafters" (each kind's ``speculators_type``)."""
    types = [kind.speculators_type for kind in KINDS.values() if kind.speculators_type]
    listed = ", ".join(types[:-1]) + f" and {types[-1]}" if len(types) > 1 else "".join(types)
    return f"it defines {listed} drafters"


def drafter_kind(name: str, where: str = "drafter kind") -> DrafterKind:
    """The heads facts of kind ``name``; one clear error naming the known kinds otherwise."""
    return KINDS[kind_record(name, where).name]


def layout_kind(layout: str) -> tuple[DrafterKind, Converter]:
    """The kind that reads the published ``layout``, and its converter."""
    for kind in KINDS.values():
        if layout in kind.layouts:
            return kind, kind.layouts[layout]
    raise UserError(f"no drafter kind reads the layout {layout!r}; draftheads knows {', '.join(KINDS)}")
