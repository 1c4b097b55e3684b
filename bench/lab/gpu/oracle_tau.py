"""Section ``oracle tau``: the decoder keeps exactly the drafts the oracle made right.

On a batch of rows (the accept, compaction and bucket paths), an oracle drafts at each set rate
with a known plan; the tau the decoder measures must equal that plan, the output must equal the
target's greedy text, and the plan must meet sum_j rate^j once enough row-steps are counted.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import torch

from .decoder import backends_for, decoder
from .log import say
from .models import references
from .oracle import DEPTH, Oracle, expected_tau

if TYPE_CHECKING:
    from transformers import PreTrainedModel

RATES = (0.6, 0.8)
TAU_TOLERANCE = 0.05
MIN_STEPS = 200  # row-steps before the oracle's low-discrepancy plan is held to TAU_TOLERANCE


@torch.no_grad()
def oracle_tau(target: PreTrainedModel, device: torch.device, prompts: torch.Tensor, new: int) -> bool:
    """tau with the oracle at each set rate, on a batch: the decoder must keep exactly the drafts
    the oracle made right (measured = planned), and the plan must meet sum_j rate^j within
    ``TAU_TOLERANCE`` once ``MIN_STEPS`` row-steps are counted (fewer: reported only)."""
    refs, _ = references(target, prompts, new + DEPTH + 1)
    V = target.config.vocab_size
    ok = True
    say(f"  {len(prompts)} rows, chain depth {DEPTH} + a wrong sibling per depth ({1 + 2 * DEPTH} nodes)")
    say("  backend       rate   expected tau   measured tau   planned   row-steps   identical   trees")
    for backend in backends_for(device):
        for rate in RATES:
            oracle = Oracle(refs, rate, DEPTH, V, new)
            gen = decoder(target, backend, lambda o=oracle: o)
            out = gen.generate(prompts.to(device), max_new_tokens=new)[:, prompts.shape[1] :].tolist()
            same = sum(o[:new] == r[:new] for o, r in zip(out, refs))
            want, got, planned = expected_tau(rate, DEPTH), oracle.tau(), statistics.mean(oracle.planned)
            counted = len(oracle.kept) >= MIN_STEPS
            good = oracle.kept == oracle.planned and same == len(refs)
            good &= abs(got - want) <= TAU_TOLERANCE or not counted
            ok &= good
            say(
                f"  {backend:<12}  {rate:4.2f}   {want:12.3f}   {got:12.3f}   {planned:7.3f}   {len(oracle.kept):9d}"
                f"   {same}/{len(refs)}         {sorted(set(gen.last_stats.tree_tokens))}  {'ok' if good else 'OFF'}"
            )
    say(
        f"  verdict: {'PASS' if ok else 'FAIL'} (measured = planned, output identical, and within "
        f"{TAU_TOLERANCE} of the set rate over {MIN_STEPS}+ row-steps)"
    )
    return ok
