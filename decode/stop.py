"""When a row of a batch is done: at an EOS token, a stop string, or ``max_new_tokens``.

Stop strings are matched by transformers' ``StopStringCriteria``, as ``generate`` matches them:
after each new token, on the row's whole text (the prompt included, so a stop string completed
across the prompt boundary is found), and a match must overlap that last token. The criterion
looks back as many tokens as a stop string has bytes, so a long multi-byte one is never cut off.
"""

from __future__ import annotations

import torch

from draftheads.conf.errors import UserError


class Stopper:
    """Ends a row at the right token: EOS, a stop string, or ``max_new_tokens``."""

    def __init__(
        self, eos: set[int], stop_strings: str | list[str] | None, tokenizer, max_new_tokens: int
    ) -> None:
        stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or [])
        if stops and tokenizer is None:
            raise UserError("stop_strings need a tokenizer; pass tokenizer= to SpeculativeGenerator")
        self.eos, self.max_new = eos, max_new_tokens
        self.criterion = _criterion(tokenizer, stops) if stops else None
        self.prompts: list[list[int]] = []  # per input row: the prompt's last tokens a match can reach

    def start(self, input_ids: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Remember each row's prompt (its real tokens, left padding dropped) for stop strings."""
        if self.criterion is None:
            return
        n = self.criterion.maximum_token_len
        ids = input_ids.tolist()
        keep = mask.tolist() if mask is not None else [[True] * len(r) for r in ids]
        self.prompts = [[t for t, v in zip(r, m) if v][-n:] for r, m in zip(ids, keep)]

    def cut(self, generated: list[int], new: list[int], row: int) -> tuple[list[int], bool]:
        """The prefix of ``new`` to keep after input row ``row``'s ``generated``, and whether the row
        is finished."""
        hit = self._first_stop(row, generated, new)
        for i, t in enumerate(new):
            if len(generated) + i + 1 >= self.max_new or t in self.eos or i == hit:
                return new[: i + 1], True
        return new, False

    def _first_stop(self, row: int, generated: list[int], new: list[int]) -> int | None:
        """The index of the first token of ``new`` that completes a stop string, if any."""
        if self.criterion is None or not new:
            return None
        n = self.criterion.maximum_token_len
        text = (self.prompts[row] + generated)[-n:] + new
        pad = int(self.criterion.embedding_vec.shape[0]) - 1  # an id that matches no stop string
        ends = [len(text) - len(new) + i + 1 for i in range(len(new))]
        windows = [([pad] * n + text[:e])[-n:] for e in ends]  # the text up to each new token
        hits = self.criterion(torch.tensor(windows, dtype=torch.long), None).tolist()
        return next((i for i, h in enumerate(hits) if h), None)


def _criterion(tokenizer, stop_strings: list[str]):
    """transformers' criterion for ``stop_strings``; a string no token can complete is refused."""
    from transformers import StopStringCriteria

    try:
        return StopStringCriteria(tokenizer, stop_strings)
    except ValueError as e:
        raise UserError(
            f"stop_strings={stop_strings!r}: no token of the tokenizer can complete one of them ({e}); "
            "use stop strings made of the tokenizer's characters"
        ) from None


def as_set(eos) -> set[int]:
    if eos is None:
        return set()
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}
