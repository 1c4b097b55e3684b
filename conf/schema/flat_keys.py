"""The flat ``draft.*`` spelling, before each kind had a section of its own, read for one more release.

A drafter's keys live in its kind's section: ``draft.<kind>.<key>``.
The flat spelling (``draft.<key>=value``) still works on the command line: the override is
moved into the chosen kind's section, and one notice per key names the new spelling. A run
config saved by the last release (a checkpoint's provenance, ``resolved_config.yaml``) holds the
flat draft keys too; :func:`nested_draft` reads it in the new shape, so that a resume compares
like with like.
"""

from __future__ import annotations

from typing import Any

from draftheads.conf.schema.kinds import DRAFT_KINDS, draft_kind


def flat_draft_key(override: str) -> str | None:
    """The key of a flat draft override (``draft.<key>=value`` -> ``<key>``), else None:
    ``draft.kind``, a section's key (``draft.<kind>.<key>``) and other groups are not flat."""
    key = override.lstrip("+~").partition("=")[0]
    group, dot, leaf = key.partition(".")
    if group != "draft" or not dot or "." in leaf or leaf == "kind" or leaf in DRAFT_KINDS:
        return None
    return leaf


def nested_override(override: str, kind: str) -> str:
    """``override`` with a flat draft key moved into ``kind``'s section (``draft.<key>=value`` ->
    ``draft.<kind>.<key>=value``); any other override as it is."""
    leaf = flat_draft_key(override)
    if leaf is None:
        return override
    prefix = override[: len(override) - len(override.lstrip("+~"))]
    return override.replace(f"{prefix}draft.{leaf}", f"{prefix}draft.{kind}.{leaf}", 1)


def nested_draft(draft: dict[str, Any]) -> dict[str, Any]:
    """A saved ``draft`` config in the sectioned shape: a flat one (``{kind, block_size, ...}``,
    written before each kind had a section) keeps ``kind`` and its kind's keys, in its section,
    and no other section; one already sectioned is returned as it is."""
    kind = draft.get("kind")
    if kind not in DRAFT_KINDS or isinstance(draft.get(kind), dict):
        return draft
    own = draft_kind(kind).keys
    return {
        "kind": kind,
        **{k: None for k in DRAFT_KINDS},
        kind: {k: v for k, v in draft.items() if k in own},
    }
