"""Importing published checkpoints: the official layouts (:mod:`.official`) and the check that an
imported file's copies of the target's tensors are the target's own (:mod:`.target_copies`).
Each kind's own key mapping lives in its folder (``heads/<kind>/convert.py``).

``from draftheads.heads.convert import convert_official`` still answers the names of the module
this package replaced (now :mod:`.official`).
"""

from draftheads.conf.moved import forward

__getattr__ = forward(__name__, "draftheads.heads.convert.official")
