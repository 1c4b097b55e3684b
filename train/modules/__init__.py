"""The module DeepSpeed trains: a drafter plus its objective, ``forward(batch, step) -> (loss, stats)``.

One module per kind (``<kind>.py``), its objective classes on :class:`Objective` (``base``);
a kind's classes are answered from its module when first asked for (``from
draftheads.train.modules import EagleObjective``), so this package names no kind. The frozen
target is held in a plain dict, outside the module tree, so it never reaches the optimizer, a
ZeRO partition or a checkpoint. An objective that puts LoRA adapters on the target is the
exception: its adapted target *is* a submodule (the adapters train), and only the adapter
parameters require gradients.

Besides the training loss, each class gives ``chains(batch)``: per draft step (a step, a head or
a block position), whether the drafter's top-1 equals the target's greedy token along a top-1
chain. The recipe turns that into held-out accuracies and a simulated acceptance length.

Each kind's record names its class (``objective``, a dotted path), and :func:`objective_class`
finds it (see docs/kinds.md).
"""

from typing import Any

from draftheads.conf.schema.kinds import kind_export
from draftheads.train.modules.base import Objective, chunked_argmax, objective_class

__all__ = ["Objective", "chunked_argmax", "objective_class"]


def __getattr__(name: str) -> Any:
    """A kind's objective class, from the kind's module (``from draftheads.train.modules import EagleObjective``)."""
    return kind_export(__name__, name)
