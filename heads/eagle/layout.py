"""How a published EAGLE checkpoint is recognised from its tensor names (``eagle-1``, ``eagle-3``)."""

from __future__ import annotations

from pathlib import Path

from draftheads.heads.layouts import fc_shape

EAGLE3_MARKS = ("d2t", "hidden_norm.weight", "midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight")
# what the layout-detection refusal names as EAGLE's tensors
HINT = "fc + layers.0.*, midlayer.*"


def classify(keys: list[str], fc_in: int | None = None, hidden: int | None = None) -> str | None:
    """The EAGLE layout that a full checkpoint's tensor names imply, or None.

    EAGLE-3 is known by its own tensors, whatever its layer prefix (``midlayer.*`` or vLLM's
    ``layers.0.*``): a ``d2t`` map, a ``hidden_norm``, or an ``fc`` over three target states
    (``fc_in == 3 * hidden``). EAGLE-1 is ``fc`` over two states plus ``layers.{i}.*``.
    """
    if any(k.startswith("midlayer.") for k in keys) or any(m in keys for m in EAGLE3_MARKS):
        return "eagle-3"
    if "fc.weight" in keys and fc_in is not None and hidden is not None and fc_in == 3 * hidden:
        return "eagle-3"
    if "fc.weight" in keys and any(k.startswith("layers.0.") for k in keys):
        return "eagle-1"
    return None


def classify_keys(keys: list[str], files: list[Path]) -> str | None:
    """:func:`classify`, with ``fc.weight``'s shape read from ``files`` when it is there."""
    shape = fc_shape(files) if "fc.weight" in keys else None
    return classify(keys, *(shape[::-1] if shape else (None, None)))
