"""A call's state, and its first phase: the prompts read into the target's cache.

:class:`Sampling` says how one call chooses the target's tokens; :class:`State` is what the call
carries from step to step for the rows still active. :meth:`Prefilling.prefill` reads the
prompts (left padding masked, positions counting only real tokens, so a row's output is the one
it gets decoded alone), takes each row's first new token from the prompt's last logits and
starts the proposer. The prefill forward is counted as a target forward but not as a decoding
step: it yields one token per row, and ``tau`` counts only the steps after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from draftheads.decode import kv, static
from draftheads.decode.planner import Planner
from draftheads.decode.processing import Processing
from draftheads.decode.proposers.base import Prefill, Proposer
from draftheads.decode.stats import DecodeStats
from draftheads.decode.stop import Stopper
from draftheads.decode.verify import draw
from draftheads.heads.masks import padded_causal, target_attention_mask


@dataclass
class Sampling:
    """How the target's tokens are chosen in one call.

    ``uniforms [B, max_new]`` (sampling only): input row b's n-th new token is drawn with
    ``uniforms[b, n]``, whatever tree verifies it, so a seed fixes the text.
    """

    sample: bool
    typical: bool
    processing: Processing
    uniforms: torch.Tensor | None
    max_new: int


@dataclass
class State:
    """Everything one call carries from step to step, for the rows still active."""

    cache: object
    kv_valid: torch.Tensor  # [b, S] which cache slots hold a real token
    lengths: torch.Tensor  # [b] slots each row owns
    lengths_cpu: list[int]
    pos: torch.Tensor  # [b] the root's position
    root: torch.Tensor  # [b] the last emitted token, not yet in the cache
    active: list[int]  # input row of each active row
    generated: list[list[int]]  # per input row
    prompts: list[list[int]]  # per input row: its real prompt tokens
    finished: list[int] = field(default_factory=list)  # input rows done at the last step
    proposer: Proposer | None = None
    planner: Planner | None = None


def output_uniforms(rows: int, max_new: int, generator: torch.Generator | None, device) -> torch.Tensor:
    """``[rows, max_new]`` uniforms, one per input row and output position, drawn before decoding
    from ``generator`` (torch's default CPU generator when None) so that they do not depend on
    the trees the call verifies."""
    where = generator.device if generator is not None else "cpu"
    return torch.rand(rows, max_new, generator=generator, device=where).to(device)


class Prefilling:
    """The prefill phase of :class:`~draftheads.decode.generator.SpeculativeGenerator` (mixed
    into it): reads its target, device and dtype, and makes a proposer with ``make_proposer``."""

    target: nn.Module
    device: torch.device
    dtype: torch.dtype

    def prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor | None,
        how: Sampling,
        stopper: Stopper,
        stats: DecodeStats,
    ) -> tuple[State, list[list[int]]]:
        """Read the prompts into the cache; the first new token of each row; start the proposer."""
        B, P = ids.shape
        valid = mask if mask is not None else torch.ones_like(ids, dtype=torch.bool)
        positions = kv.slot_positions(valid)
        proposer = self.make_proposer()
        cache = kv.new_cache(self.target)
        out = self.target(
            input_ids=ids,
            attention_mask=target_attention_mask(
                self.target.config, padded_causal(valid), positions, positions, self.dtype
            ),
            position_ids=positions,
            cache=cache,
            use_cache=True,
            output_hidden_states=static.hidden_request(proposer.hidden_layers),
            logits_to_keep=1,
        )
        stats.target_forwards += 1
        prompts = [[t for t, v in zip(r, m) if v] for r, m in zip(ids.tolist(), valid.tolist())]
        # the prompt's last token is the "root" whose logits give the first new token
        last = ids[:, -1:]
        scores = how.processing(out.logits[:, -1:], list(range(B)), prompts, last, torch.zeros_like(last))
        root = draw(scores[:, 0].softmax(-1), how.uniforms[:, 0]) if how.sample else scores[:, 0].argmax(-1)
        proposer.prefill(Prefill(out.hidden_states, ids, valid, positions, root))
        state = State(
            cache=cache,
            kv_valid=valid,
            lengths=torch.full((B,), P, device=self.device),
            lengths_cpu=[P] * B,
            pos=positions[:, -1] + 1,
            root=root,
            active=list(range(B)),
            generated=[[] for _ in range(B)],
            prompts=prompts,
            proposer=proposer,
        )
        first: list[list[int]] = [[] for _ in range(B)]
        for b, t in enumerate(root.tolist()):
            kept, done = stopper.cut(state.generated[b], [t], b)
            state.generated[b] += kept
            first[b] = kept
            if done:
                state.finished.append(b)
        stats.new_tokens += B
        return state, first
