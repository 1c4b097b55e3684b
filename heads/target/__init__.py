"""The frozen target: loading it (:mod:`.load`), the embedded default (:mod:`.embedded`), sharding
it across devices (:mod:`.placement`), its decoder layers (:mod:`.layers`) and the fingerprint
that ties a drafter to it (:mod:`.fingerprint`).

``from draftheads.heads.target import load_target`` still answers the names of the module this
package replaced (now :mod:`.load`).
"""

from draftheads.conf.moved import forward

__getattr__ = forward(__name__, "draftheads.heads.target.load")
