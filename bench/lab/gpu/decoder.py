"""The decoder under test: a ``SpeculativeGenerator`` on one backend with the drafting a section picks.

Each section runs the two backends of its device (:func:`backends_for`): ``eager``, and
``cuda-graphs`` on CUDA or, elsewhere, ``static`` (the cuda-graphs path without capture), so the
CPU check runs the same fixed-shape code the GPU captures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.proposers.base import Proposer
    from draftheads.heads import EagleDrafter


def decoder(
    target: PreTrainedModel,
    backend: str,
    drafting: Callable[[], Proposer] | None,
    eagle: EagleDrafter | None = None,
) -> SpeculativeGenerator:
    """A SpeculativeGenerator on ``backend`` (``static``: the cuda-graphs path without capture)
    whose proposer is ``drafting()`` (or EAGLE-3 with lookup branches when it is None)."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator, static
    from draftheads.decode.proposers import WithLookup

    cfg = DecodeConfig(
        backend="eager" if backend == "static" else backend,
        dynamic=True,
        top_k_draft=4,
        depth=4,
        total_tokens=16,
        lookup=True,
        cost_aware=False,
    )
    gen = SpeculativeGenerator(target, eagle if drafting is None else None, None, cfg)
    if backend == "static":
        gen.static_verifier = static.shared(target, capture=False)
    make = gen.make_proposer

    def proposer() -> Proposer:
        if drafting is not None:
            return drafting()
        out = make()
        inner = out.proposer if isinstance(out, WithLookup) else out
        if backend == "static":  # fixed-shape drafting, as cuda-graphs captures it
            inner.graphs = static.drafter_graphs(eagle, capture=False)
        return out

    gen.make_proposer = proposer
    return gen


def backends_for(device: torch.device) -> list[str]:
    return ["eager", "cuda-graphs" if device.type == "cuda" else "static"]
