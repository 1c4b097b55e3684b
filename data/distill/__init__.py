"""Self-distillation: the run (:mod:`.run`), its output folder and resuming (:mod:`.shards`), a
batch's answers (:mod:`.answers`), the generation itself (:mod:`.generate`) and the round-trip
count (:mod:`.roundtrip`).

``from draftheads.data.distill import distill`` still answers the names of the module this package
replaced (now :mod:`.run`).
"""

from draftheads.conf.moved import forward

__getattr__ = forward(__name__, "draftheads.data.distill.run")
