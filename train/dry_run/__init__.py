"""``train.dry_run=true``: size the real run (:mod:`.sizing`), train a tiny stand-in of the target's
family (:mod:`.tiny_run`), and print both (:mod:`.main`).

``draftheads.train.dry_run.run`` still answers the names of the module this package replaced (now
:mod:`.main`).
"""

from draftheads.conf.moved import forward

__getattr__ = forward(__name__, "draftheads.train.dry_run.main")
