"""The held-out evaluation a run logs (``eval/*``): top-1 accuracy per draft step and a
simulated acceptance length, from the objective's ``chains`` on the held-out rows.

Each objective gives, per draft step (a step, a head or a block position; its class's
``eval_depth`` and ``eval_label`` name them), whether the drafter's top-1 equals the target's
greedy token along a top-1 chain; the accuracies are over every valid position, and tau is a
chain's accepted length (a block drafter's chain is its block) averaged over the chains that
start at a valid position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from draftheads.conf.schema.heads import DraftConfig
from draftheads.train.modules import Objective
from draftheads.train.objectives import chain_acceptance


@torch.no_grad()
def heldout_metrics(
    module: Objective,
    rows: Sequence[dict],
    batch: Callable[[list[dict]], dict[str, torch.Tensor]],
    d: DraftConfig,
    micro_batch_size: int,
) -> dict[str, float]:
    """Held-out top-1 per draft step (a step, a head or a block position) against the target's
    greedy tokens, and tau: a top-1 chain's accepted length (a block drafter's: its block's).
    ``batch`` turns ``micro_batch_size`` rows into a micro-batch on the engine's device."""
    depth = max(type(module).eval_depth(d), 1)
    hits, counts, gains = None, None, []
    mbs = micro_batch_size
    for i in range(0, len(rows), mbs):
        correct, valid = module.chains(batch(rows[i : i + mbs]), depth)
        h, c = (correct & valid).flatten(1).sum(1), valid.flatten(1).sum(1)
        hits, counts = (h, c) if hits is None else (hits + h, counts + c)
        gains.append(chain_acceptance(correct, valid)[valid[0]].double())
    name, first = type(module).eval_label
    out = {
        f"eval/{name}{s + first}/acc_top1": float(hits[s]) / max(int(counts[s]), 1) for s in range(len(hits))
    }
    gain = torch.cat(gains)
    out["eval/tau"] = float(gain.mean()) if gain.numel() else 1.0
    return out
