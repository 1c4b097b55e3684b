"""Capture before a call: every CUDA graph a call replays on ``decode.backend=cuda-graphs``,
made before the call runs (or is timed), so that the call itself captures nothing.

Two kinds of graph: the target's verify forward of every bucket (static/forward.py), and the
drafter's fixed-shape drafting call (static/graphs.py), made by reading a one-token prompt and
drafting once per batch size. On another backend there is nothing to capture.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.decode import static
from draftheads.decode.proposers.base import Prefill, Proposer
from draftheads.decode.static import shapes


def fixed_shape_graphs(proposer: Proposer) -> static.Graphs | None:
    """The graphs hook ``proposer`` drafts through (inside a lookup combination), if any."""
    inner = getattr(proposer, "proposer", proposer)
    return getattr(inner, "graphs", None)


class Capturing:
    """Ahead-of-time capture for :class:`~draftheads.decode.generator.SpeculativeGenerator`
    (mixed into it): reads its target and device, and uses its proposers, backend and clock."""

    target: nn.Module
    device: torch.device

    @torch.no_grad()
    def capture(self, batch: int = 1, context: int = 512) -> float:
        """Capture the CUDA graphs that calls of up to ``batch`` rows and ``context`` tokens each
        (prompt and new tokens) replay on ``decode.backend=cuda-graphs``, before any of them runs
        (or is timed): the verify forward of every bucket, largest first, into the verifier's
        memory pool, and the drafter's fixed-shape drafting call, for ``batch`` rows down to one;
        the buffers are sized for ``context``, so such a call captures nothing. Returns the
        seconds it took.

        Nothing to capture (another backend): a no-op. A verifier or drafting hook made with
        ``capture=False`` (the tests' CPU path) runs the same calls eagerly."""
        if batch < 1 or context < 1:
            raise UserError(f"capture(batch={batch}, context={context}): both must be at least 1")
        t0 = time.perf_counter()
        verifier = static.verifier(self)
        proposer = self.make_proposer()
        graphs = fixed_shape_graphs(proposer)
        if verifier is None and graphs is None:
            return 0.0
        with self._run_backend().active():
            if verifier is not None:
                verifier.prepare(batch, context, proposer.hidden_layers)
            if graphs is not None:
                graphs.pool.capacity = max(
                    graphs.pool.capacity, shapes.capacity_for(context + shapes.BUCKETS[-1] + 1)
                )
                for rows in range(batch, 0, -1):
                    self._draft_once(rows, self.make_proposer())
        self._now()
        return time.perf_counter() - t0

    def _draft_once(self, rows: int, proposer: Proposer) -> None:
        """A one-token prompt of ``rows`` rows read by ``proposer`` and one tree drafted: its
        fixed-shape call made on the lease the next call takes (released when it is dropped)."""
        from transformers import DynamicCache

        ids = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
        valid = torch.ones_like(ids, dtype=torch.bool)
        out = self.target(
            input_ids=ids,
            cache=DynamicCache(),
            use_cache=True,
            output_hidden_states=static.hidden_request(proposer.hidden_layers),
            logits_to_keep=1,
        )
        root = ids[:, 0]
        proposer.prefill(Prefill(out.hidden_states, ids, valid, torch.zeros_like(ids), root))
        proposer.propose(root, torch.ones_like(root))
