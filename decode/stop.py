"""When a row of a batch is done: at an EOS token, a stop string, or ``max_new_tokens``."""

from __future__ import annotations

import torch

from draftheads.conf.errors import UserError


class Stopper:
    """Ends a row at the right token: EOS, a stop string, or ``max_new_tokens``."""

    def __init__(self, eos: set[int], stop_strings: list[str] | None, tokenizer, max_new_tokens: int) -> None:
        if stop_strings and tokenizer is None:
            raise UserError("stop_strings need a tokenizer; pass tokenizer= to SpeculativeGenerator")
        self.eos, self.stops, self.tok, self.max_new = (
            eos,
            list(stop_strings or []),
            tokenizer,
            max_new_tokens,
        )
        self.window = max((len(s) for s in self.stops), default=0) + 8  # tokens: >= 1 char each, mostly

    def cut(self, generated: list[int], new: list[int]) -> tuple[list[int], bool]:
        """The prefix of ``new`` to keep after ``generated``, and whether the row is finished."""
        for i, t in enumerate(new):
            if (
                len(generated) + i + 1 >= self.max_new
                or t in self.eos
                or self._stopped(generated + new[: i + 1])
            ):
                return new[: i + 1], True
        return new, False

    def _stopped(self, ids: list[int]) -> bool:
        if not self.stops:
            return False
        tail = self.tok.decode(ids[-self.window :])
        before = self.tok.decode(ids[-self.window : -1])
        # stop at the first token after which the text holds a stop string it did not hold before
        return any(s in tail and s not in before for s in self.stops)


def as_set(eos) -> set[int]:
    if eos is None:
        return set()
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}
