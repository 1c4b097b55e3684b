"""Section ``verify cost and overhead``: what one verification costs, and what the decoder adds.

One forward over n new tokens after a cached context, on the path each backend runs: eager on a
``DynamicCache``, and the captured graph replayed at the bucket sizes (on CPU, the same
fixed-shape forward uncaptured). The curve says how many drafted tokens a step can afford; the
decoder's measured step (from ``speed``) against the bare forward of its own path and size is
its per-step overhead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .decoder import backends_for
from .log import say
from .oracle import DEPTH
from .timing import median_ms

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64)


@torch.no_grad()
def verify_cost(
    target: PreTrainedModel, device: torch.device, repeats: int, found: dict, context: int = 128
) -> None:
    """A bare verify forward per size on each backend's own path, and the decoder's overhead."""
    from transformers import DynamicCache

    from draftheads.decode import static
    from draftheads.decode.kv import tree_mask

    verifier = static.StaticVerifier(target, capture=device.type == "cuda")
    prompt = torch.randint(1, target.config.vocab_size, (1, context), device=device)
    valid = torch.ones(1, context, dtype=torch.bool, device=device)
    eager_ms, graph_ms = {}, {}
    tree = 1 + 2 * DEPTH  # the oracle's tree: eager verifies it as is, graphs at its bucket
    sizes = sorted({*CURVE_SIZES, tree})
    for n in sizes:
        cache = DynamicCache()
        target(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
        chain = static.ancestors(torch.arange(n, device=device).clamp_min(1)[None] - 1)
        ids = torch.randint(1, target.config.vocab_size, (1, n), device=device)
        pos = torch.arange(context, context + n, device=device)[None]
        mask = tree_mask(valid, chain, verifier.dtype)

        def eager(ids=ids, pos=pos, mask=mask, cache=cache, n=n) -> None:
            target(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
            cache.crop(-n)

        eager_ms[n] = median_ms(eager, device, repeats)
        kv = static.StaticKV.adopt(cache, verifier.pool, static.shapes.BUCKETS[-1] + 1)
        entry = verifier._entry(1, n, kv.capacity, True, kv.lease)
        entry.ids.copy_(ids)
        entry.pos.copy_(pos)
        entry.mask.copy_(static.static_mask(valid, chain, kv.capacity, verifier.dtype))
        entry.write.copy_(pos[0])
        kv.write_index = entry.write
        if verifier.capture:
            verifier._replay(entry, kv, True)  # captures
            graph_ms[n] = median_ms(entry.graph.replay, device, repeats)
        else:
            graph_ms[n] = median_ms(lambda e=entry, c=kv: verifier.forward(e, c, True), device, repeats)
    graphs = backends_for(device)[1]
    say(f"  new tokens   eager ms   {graphs} ms   eager x c(1)   {graphs} x c(1)")
    for n in sizes:
        say(
            f"  {n:>10}   {eager_ms[n]:8.3f}   {graph_ms[n]:10.3f}   {eager_ms[n] / eager_ms[1]:12.2f}"
            f"   {graph_ms[n] / graph_ms[1]:9.2f}"
        )
    if not found:
        return
    size = tree
    bare = {"eager": eager_ms[size], graphs: graph_ms[static.bucket(size)]}
    say(
        f"  decoder step (oracle tree of {size}, bucket {static.bucket(size)}) against the bare forward of its path:"
    )
    for backend, ms in found["step_ms"].items():
        over = ms - bare[backend]
        say(
            f"  {backend:<12} step {ms:8.3f} ms   bare {bare[backend]:8.3f} ms   overhead {over:8.3f} ms = {100 * over / bare[backend]:6.1f}%"
        )
