"""Sections ``identity fp32`` and ``identity bf16``: tree decoding gives the target's own greedy text.

Each backend decodes every prompt with an oracle drafter (long acceptance, compaction) and with
EAGLE-3 plus lookup branches, against the target's greedy ``generate``. In fp32 (TF32 off) every
prompt must be identical. In bf16 two correct programs may round a near-tie differently, so a
prompt's first divergence is a tie when the reference's top-1/top-2 margin there is within
``TIE_ULPS`` bf16 ulps, and a failure otherwise.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

import torch

from .decoder import backends_for, decoder
from .log import say
from .models import references
from .oracle import DEPTH, Oracle

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from draftheads.heads import EagleDrafter

TIE_ULPS = 4  # a bf16 divergence within this margin of the reference's top-2 is a tie, not a bug


@torch.no_grad()
def identity(
    target: PreTrainedModel,
    eagle: EagleDrafter,
    device: torch.device,
    prompts: torch.Tensor,
    new: int,
    margins: bool,
) -> bool:
    """Tree decoding against the target's greedy ``generate``, per backend and drafting method.

    With ``margins`` (bf16), a prompt's first divergence is a tie when the reference's
    top-1/top-2 margin there is within ``TIE_ULPS`` bf16 ulps of its top-1 logit.
    """
    refs, logits = references(target, prompts, new, logits=margins)
    V = target.config.vocab_size
    say(
        "  backend       drafting         identical   tokens matching   tau"
        + ("   ties  FAILS" if margins else "")
    )
    ok = True
    for backend in backends_for(device):
        for name in ("oracle-0.8", "eagle3+lookup"):
            oracle = Oracle(refs, 0.8, DEPTH, V, new) if name.startswith("oracle") else None
            gen = decoder(target, backend, (lambda o=oracle: o) if oracle else None, eagle)
            same = match = ties = fails = 0
            taus = []
            for ids, ref, i in zip(prompts, refs, range(len(refs))):
                if oracle is not None:  # drafts past the reference's end are wrong, and rejected
                    oracle.refs = [ref]
                ids = ids[None].to(device)
                out = gen.generate(ids, max_new_tokens=new)[0, ids.shape[1] :].tolist()
                first = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), len(ref))
                same += first == len(ref)
                match += first
                taus.append(gen.last_stats.tau)
                if margins and first < len(ref):
                    top = logits[i][first].topk(2).values
                    ulp = 2.0 ** (math.floor(math.log2(max(abs(float(top[0])), 1e-30))) - 7)
                    tie = float(top[0] - top[1]) <= TIE_ULPS * ulp
                    ties, fails = ties + tie, fails + (not tie)
            total = len(refs) * new
            row = f"  {backend:<12}  {name:<15}  {same}/{len(refs)} = {same / len(refs):4.2f}      {match / total:6.3f}       {statistics.mean(taus):5.2f}"
            say(row + (f"   {ties:4d}  {fails:5d}" if margins else ""))
            ok &= (fails == 0) if margins else same == len(refs)
    say(
        f"  verdict: {'PASS' if ok else 'FAIL'}"
        + (f" (divergences above {TIE_ULPS} ulps fail)" if margins else " (expected 1.00)")
    )
    return ok
