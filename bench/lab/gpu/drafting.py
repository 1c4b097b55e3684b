"""Section ``drafting``: the fixed-shape drafting calls the graphs backend captures, timed.

The EAGLE-3 draft step (a top-k tree of a set depth) and DFlash's drafting call (the block pass
and DDTree, ``draft_tree``, through the ``drafter_graphs`` hook), each after a cached context:
eager, and on CUDA captured as one graph, with the capture's time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .log import say
from .timing import median_ms

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from draftheads.heads import DFlashDrafter, EagleDrafter


@torch.no_grad()
def drafting(
    target: PreTrainedModel,
    eagle: EagleDrafter,
    dflash: DFlashDrafter,
    device: torch.device,
    repeats: int,
    context: int = 128,
) -> None:
    """The fixed-shape drafting calls after ``context`` cached positions, eager and captured."""
    eagle_step(target, eagle, device, repeats, context=context)
    dflash_step(target, dflash, device, repeats, context=context)


def eagle_step(
    target: PreTrainedModel,
    eagle: EagleDrafter,
    device: torch.device,
    repeats: int,
    k: int = 4,
    depth: int = 4,
    context: int = 128,
) -> None:
    """The fixed-shape EAGLE-3 draft step after ``context`` cached pairs, eager and captured."""
    from transformers import DynamicCache

    from draftheads.decode import static
    from draftheads.decode.proposers.eagle import fixed_tree

    p = next(target.parameters())
    H, n = target.config.hidden_size, 15
    g = torch.Generator(device=device).manual_seed(0)
    feats = torch.randn(1, context, 3 * H, device=device, dtype=p.dtype, generator=g)
    tokens = torch.randint(0, target.config.vocab_size, (1, context), device=device, generator=g)
    cache = DynamicCache()
    eagle(tokens, eagle.fuse(feats), torch.arange(context, device=device)[None], None, cache)
    root = tokens[:, -1]
    pos = torch.full((1,), context, device=device)
    h_root = torch.randn(1, H, device=device, dtype=p.dtype, generator=g)
    for capture in sorted({False, device.type == "cuda"}):
        graphs = static.Graphs(device, capture=capture)
        kv = static.StaticKV.adopt(cache, graphs.pool, (depth - 1) * k)
        valid = torch.zeros(1, kv.capacity, dtype=torch.bool, device=device)
        valid[:, :context] = True
        base = torch.full((), context, device=device)

        def step(valid, base, root, pos, h_root, kv=kv):
            return fixed_tree(eagle, kv, valid, base, root, pos, h_root, k, depth, n)

        args = (valid, base, root, pos, h_root)
        ms = median_ms(lambda g=graphs, f=step, a=args: g.run(("eagle", 1), f, *a), device, repeats)
        how = "captured" if capture else "eager"
        extra = f" (capture {graphs.capture_s:.2f} s)" if capture else ""
        say(
            f"  EAGLE-3 draft step, top-{k}, depth {depth}, {n} nodes, {context} cached, {how}: {ms:8.3f} ms{extra}"
        )


def dflash_step(
    target: PreTrainedModel,
    dflash: DFlashDrafter,
    device: torch.device,
    repeats: int,
    k: int = 4,
    n: int = 15,
    context: int = 128,
) -> None:
    """DFlash's drafting call, ``draft_tree`` (the block pass over fixed-capacity context buffers,
    each position's top-``k``, DDTree's ``n`` best paths), after ``context`` cached positions,
    through the ``drafter_graphs`` hook: eager, and captured (one graph) on CUDA."""
    from draftheads.decode import static
    from draftheads.decode.proposers.dflash import draft_tree

    p = next(target.parameters())
    H, drafts = target.config.hidden_size, dflash.block_size - 1
    F = len(dflash.feature_layers()) * H
    g = torch.Generator(device=device).manual_seed(0)
    feats = torch.randn(1, context, F, device=device, dtype=p.dtype, generator=g)
    positions = torch.arange(context, device=device)[None]
    root = torch.randint(0, target.config.vocab_size, (1,), device=device, generator=g)
    pos = torch.full((1,), context, device=device)
    for capture in sorted({False, device.type == "cuda"}):
        graphs = static.drafter_graphs(dflash, capture=capture)
        kv = static.StaticKV(graphs.pool, dflash.num_decoder_layers)
        for layer, (key, value) in zip(kv.layers, dflash.context_kv(feats, positions)):
            layer.keys, layer.values = key, value  # the context in the lease's buffers
        valid = torch.zeros(1, kv.capacity, dtype=torch.bool, device=device)
        valid[:, :context] = True

        def step(valid, root, pos, kv=kv):
            buffers = [(layer.k_buf, layer.v_buf) for layer in kv.layers]
            return draft_tree(dflash, buffers, valid, root, pos, None, drafts, k, n)

        key = ("dflash", 1, kv.capacity, kv.lease, drafts, k, n, 0)
        args = (valid, root, pos)
        ms = median_ms(lambda gr=graphs, f=step, a=args, key=key: gr.run(key, f, *a), device, repeats)
        how = "captured" if capture else "eager"
        extra = f" (capture {graphs.capture_s:.2f} s)" if capture else ""
        say(
            f"  DFlash draft call, block {dflash.block_size}, {dflash.num_decoder_layers} layers, top-{k}, "
            f"DDTree {n} nodes, {context} cached, {how}: {ms:8.3f} ms{extra}"
        )
