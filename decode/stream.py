"""A call, from its arguments to its tokens: ``generate`` and ``stream``.

``stream`` resolves the call's settings as ``target.generate`` does (decode/processing.py),
refuses what the tree decoder cannot serve (right padding, a request past the target's
positions), sets up sampling and the planner, then runs the phases in order (prefill,
then a step per target forward while any row is active, each under the call's backend) and
yields each forward's new tokens. ``generate`` collects them into ``target.generate``'s output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn
from transformers import GenerationConfig

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.context import check_request
from draftheads.decode.planner import Planner
from draftheads.decode.prefill import Sampling, output_uniforms
from draftheads.decode.processing import Processing, check_lossless, resolve
from draftheads.decode.stats import DecodeStats
from draftheads.decode.stop import Stopper, as_set


def check_left_padded(mask: torch.Tensor | None) -> None:
    """Refuse a right-padded batch: the decoder continues every row from its last column."""
    if mask is None or mask.shape[1] < 2:
        return
    bad = (mask[:, :-1] & ~mask[:, 1:]).any(-1) | ~mask[:, -1]
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise UserError(
            f"attention_mask row {row} has padding after its tokens (right padding); pad prompts on the "
            "left (tokenizer.padding_side='left') so every row ends with a real token"
        )


class Streaming:
    """The public calls of :class:`~draftheads.decode.generator.SpeculativeGenerator` (mixed into
    it): read its target, tokenizer, config, device and backend, and run its phases."""

    target: nn.Module
    tokenizer: object
    recurrent: list[str]
    config: DecodeConfig
    device: torch.device
    backend: str
    last_stats: DecodeStats
    last_planner: Planner | None
    _now: Callable[[], float]

    @torch.no_grad()
    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        """Decode like ``target.generate``: returns ``[B, P + new]`` (prompt, then new tokens
        right-padded with the pad id). Keyword arguments as :meth:`stream`."""
        B, P = input_ids.shape
        rows: list[list[int]] = [[] for _ in range(B)]
        for step in self.stream(input_ids, attention_mask, **kwargs):
            for b, toks in enumerate(step):
                rows[b] += toks
        pad = self.pad_id()
        out = torch.full((B, P + max(map(len, rows), default=0)), pad, dtype=torch.long)
        out[:, :P] = input_ids.cpu()
        for b, r in enumerate(rows):
            out[b, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
        return out.to(input_ids.device)

    def pad_id(self) -> int:
        """The id ``generate`` pads finished rows with (as the target's ``generate`` does)."""
        gc = getattr(self.target, "generation_config", None)
        for cand in (
            getattr(gc, "pad_token_id", None),
            getattr(self.tokenizer, "pad_token_id", None),
            getattr(gc, "eos_token_id", None),
        ):
            if cand is not None:
                return int(cand[0] if isinstance(cand, (list, tuple)) else cand)
        return 0

    @torch.no_grad()
    def stream(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: list[str] | None = None,
        typical: bool | None = None,
        generator: torch.Generator | None = None,
        generation_config: GenerationConfig | None = None,
        **settings,
    ) -> Iterator[list[list[int]]]:
        """Yield, per target forward, the new tokens of every input row (``[]`` for finished rows).

        Settings are resolved as ``target.generate`` resolves them (decode/processing.py): the
        arguments, then any other ``GenerationConfig`` field given as a keyword (e.g.
        ``repetition_penalty=1.3``), over ``generation_config``, over the set values of the
        :class:`DecodeConfig`, over the target's generation config (its eos, sampling defaults,
        penalties). With sampling, ``generator`` (else torch's default CPU generator) draws one
        uniform per output position up front. Stats of the call land in ``self.last_stats``,
        its wall time split into parts that add up to it (decode/stats.py), the caller's time
        between yields included.
        """
        stats = self.last_stats = DecodeStats(backend=self.backend)
        stats.lap("setup", self._now())  # starts the call's clock
        cfg = self.config
        asked = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature)
        asked.update(top_p=top_p, top_k=top_k, eos_token_id=eos_token_id, stop_strings=stop_strings)
        gc = resolve(self.target, cfg, generation_config, {**asked, **settings})
        check_lossless(gc)
        max_new = gc.max_new_tokens
        if max_new < 1:
            raise UserError(f"max_new_tokens={max_new}: must be at least 1")
        stopper = Stopper(as_set(gc.eos_token_id), gc.stop_strings, self.tokenizer, max_new)
        mask = attention_mask.to(self.device).bool() if attention_mask is not None else None
        check_left_padded(mask)
        B, P = input_ids.shape
        if B > 1 and self.recurrent:
            raise UserError(
                f"the target has {self.recurrent[0]} layers, whose state is rolled back for one row at a time; "
                f"decode its {B} prompts one call each (batch_size=1)"
            )
        prompt_lens = mask.sum(-1).tolist() if mask is not None else [P] * B  # real tokens per row
        check_request(self.target.config, max(prompt_lens), max_new)
        sample = bool(gc.do_sample)
        how = Sampling(
            sample,
            (cfg.typical if typical is None else typical) and sample,
            Processing(self.target, gc, prompt_lens, max_new, self.device),
            output_uniforms(B, max_new, generator, self.device) if sample else None,
            max_new,
        )
        planner_curve = self.cost_curve(*input_ids.shape) if cfg.cost_aware else None  # read, not measured
        stopper.start(input_ids, mask)
        run = self._run_backend()
        stats.lap("setup", self._now())
        with run.active():  # per phase: a stream suspended at a yield leaves the modules stock
            state, first = self.prefill(input_ids.to(self.device), mask, how, stopper, stats)
        if planner_curve is not None:
            lookup = getattr(state.proposer, "lookup", None) is not None
            state.planner = Planner(planner_curve, len(state.active), lookup=lookup)
            if self.last_planner is not None:
                state.planner.carry(self.last_planner)
        stats.lap("prefill", self._now())
        yield first
        stats.lap("caller", self._now())
        while self.retire(state):
            with run.active():
                stats.lap("bookkeeping", self._now())
                out = self.step(state, how, stopper, stats)
            stats.lap("bookkeeping", self._now())
            yield out
            stats.lap("caller", self._now())
        self.last_planner = state.planner  # the next call starts from what this one learned
        stats.lap("bookkeeping", self._now())
