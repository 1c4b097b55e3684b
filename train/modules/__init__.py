"""The module DeepSpeed trains: a drafter plus its objective, ``forward(batch, step) -> (loss, stats)``.

One class per objective family, one file each: :class:`MedusaObjective` and
:class:`Medusa2Objective` (``medusa``), :class:`EagleObjective` (``eagle``, EAGLE-1 and
EAGLE-3), :class:`DFlashObjective` (``dflash``), :class:`PEagleObjective` (``peagle``), all on :class:`Objective` (``base``). The frozen
target is held in a plain dict, outside the module tree, so it never reaches the optimizer, a
ZeRO partition or a checkpoint. Medusa-2 is the exception: its LoRA-adapted target *is* a
submodule (the adapters train), and only the adapter parameters require gradients.

Besides the training loss, each class gives ``chains(batch)``: per draft step (DFlash: per
block position), whether the drafter's top-1 equals the target's greedy token along a top-1
chain. The recipe turns that into held-out accuracies and a simulated acceptance length.

Each kind's record names its class (``objective``, a dotted path), and :func:`objective_class`
finds it (see docs/kinds.md).
"""

from draftheads.train.modules.base import Objective, chunked_argmax, objective_class
from draftheads.train.modules.dflash import DFlashObjective
from draftheads.train.modules.eagle import EagleObjective
from draftheads.train.modules.medusa import Medusa2Objective, MedusaObjective
from draftheads.train.modules.peagle import PEagleObjective

__all__ = [
    "DFlashObjective",
    "EagleObjective",
    "Medusa2Objective",
    "MedusaObjective",
    "Objective",
    "PEagleObjective",
    "chunked_argmax",
    "objective_class",
]
