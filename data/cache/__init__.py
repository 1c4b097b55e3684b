"""The offline feature cache: its on-disk format (:mod:`.manifest`), building it (:mod:`.build`,
one shard at a time through :mod:`.encode`), views made of other caches' shards (:mod:`.views`)
and reading it back (:mod:`.read`).

``from draftheads.data.cache import FeatureCache`` still answers the names of the module this
package replaced (now :mod:`.read`).
"""

from draftheads.conf.moved import forward

__getattr__ = forward(__name__, "draftheads.data.cache.read")
