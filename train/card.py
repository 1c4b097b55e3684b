"""The model card (``README.md``) written beside a trained drafter.

There is one card writer, :func:`draftheads.heads.card.model_card` (the Hub card too); the
training card adds the held-out metrics of the last evaluation and the training provenance.
"""

from __future__ import annotations

from typing import Any

from draftheads.heads.card import model_card as drafter_card


def model_card(drafter, provenance: dict[str, Any], final: dict[str, float]) -> str:
    """Markdown with hub metadata (base_model links the drafter to its target's model tree)."""
    conf = {**drafter.config_dict(), "provenance": provenance}
    return str(drafter_card(conf, metrics=final))
