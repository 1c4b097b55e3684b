"""Chat templating and loss masks, found from the tokenizer's own template.

The loss mask marks the tokens of every assistant turn and nothing else. Where the assistant
turns are is read off the template itself, never from hard-coded separators:

* **prefix rendering** (any template): for assistant message ``i``, the conversation up to
  ``i`` rendered with ``add_generation_prompt=True`` ends exactly where the answer starts, and
  the conversation through ``i`` ends where the turn ends. Both must be prefixes of the full
  rendering, or the row is rejected (the template is not prefix-stable for it).
* **generation markers**: a template with ``{% generation %}`` blocks states its trained spans;
  transformers' ``return_assistant_tokens_mask`` reads them.

The end-of-turn token is trained: at inference the target emits it to stop, and a drafter that
cannot predict it proposes tokens past the end of every answer. Not so for an answer marked
``"unfinished": true`` (distillation cut it off at ``max_new_tokens``): the target did not end
there, so its span stops where the answer's text does and the template's turn end is untrained.
Template text after the turn's last special token that is only whitespace (SmolLM2's ``"\\n"``
after ``<|im_end|>``) is not trained: the target never generates it, the template writes it.

Tokens are assigned to a span when their character range overlaps it, so a token that
straddles the boundary between the generation prompt and the answer is trained.
"""

from __future__ import annotations

import numpy as np

from draftheads.conf.errors import UserError
from draftheads.data.formats import RowError

Messages = list[dict[str, str]]


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def has_generation_markers(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "{% generation %}" in template or "{%- generation %}" in template


def render(tokenizer, messages: Messages, add_generation_prompt: bool = False) -> str:
    """The template's text for ``messages``; a template error is a malformed row."""
    if not has_template(tokenizer):
        raise UserError(
            "the target tokenizer has no chat template; use data.format=text, or a target with a template"
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as e:  # jinja raise_exception(), e.g. roles that do not alternate
        raise RowError(f"chat template rejected the row: {str(e).splitlines()[0][:120]}") from None


def _special_strings(tokenizer) -> list[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(tok, "special", False):
            specials.add(str(tok))
    return sorted((s for s in specials if s), key=len, reverse=True)


def trim_turn_end(text: str, start: int, end: int, specials: list[str]) -> int:
    """End of the trained span: drop whitespace-only template text after the last special token."""
    last = -1
    for s in specials:
        j = text.rfind(s, start, end)
        if j >= 0 and j + len(s) <= end:
            last = max(last, j + len(s))
    if last > start and not text[last:end].strip():
        return last
    return end


def assistant_spans(tokenizer, messages: Messages) -> tuple[str, list[tuple[int, int]]]:
    """The full rendering and the character span ``[start, end)`` of each assistant turn."""
    full = render(tokenizer, messages)
    specials = _special_strings(tokenizer)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        through = render(tokenizer, messages[: i + 1])
        if not (full.startswith(before) and full.startswith(through) and len(through) > len(before)):
            raise RowError(
                f"chat template is not prefix-stable at assistant turn {i}; its span cannot be located"
            )
        if m.get("unfinished"):
            spans.append((len(before), unfinished_end(full, len(before), len(through), m["content"])))
        else:
            spans.append((len(before), trim_turn_end(full, len(before), len(through), specials)))
    return full, spans


def unfinished_end(text: str, start: int, end: int, content: str) -> int:
    """End of an unfinished answer's span: where its own text ends inside the rendered turn."""
    for piece in (content, content.strip()):
        j = text.find(piece, start, end) if piece else -1
        if j >= 0:
            return j + len(piece)
    raise RowError("the chat template changed an unfinished answer's text; its end cannot be located")


def mask_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose character range overlaps one of ``spans``."""
    if not spans or not offsets:
        return [0] * len(offsets)
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(off), dtype=np.int8)
    for s, e in spans:
        mask |= ((off[:, 0] < e) & (off[:, 1] > s)).astype(np.int8)
    return mask.tolist()


def encode_chat(tokenizer, messages: Messages, method: str = "auto") -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of one conversation (see the module docstring for the rules)."""
    out = encode_chats(tokenizer, [messages], method)[0]
    if isinstance(out, RowError):
        raise out
    return out


def encode_chats(
    tokenizer, batch: list[Messages], method: str = "auto"
) -> list[tuple[list[int], list[int]] | RowError]:
    """Encode many conversations at once (one batched tokenizer call); errors are returned per row."""
    if method == "auto":
        method = "markers" if has_generation_markers(tokenizer) else "prefix"
    if method == "markers":  # the markers cannot stop a span early: unfinished answers go by prefix
        return [
            encode_chats(tokenizer, [m], "prefix")[0]
            if any(t.get("unfinished") for t in m)
            else _encode_markers(tokenizer, m)
            for m in batch
        ]
    rendered: list[tuple[str, list[tuple[int, int]]] | RowError] = []
    for messages in batch:
        try:
            rendered.append(assistant_spans(tokenizer, messages))
        except RowError as e:
            rendered.append(e)
    ok = [r for r in rendered if not isinstance(r, RowError)]
    enc = (
        tokenizer([text for text, _ in ok], add_special_tokens=False, return_offsets_mapping=True)
        if ok
        else {"input_ids": [], "offset_mapping": []}
    )
    out, k = [], 0
    for r in rendered:
        if isinstance(r, RowError):
            out.append(r)
            continue
        ids, offsets = enc["input_ids"][k], enc["offset_mapping"][k]
        out.append((list(ids), mask_from_offsets(offsets, r[1])))
        k += 1
    return out


def _encode_markers(tokenizer, messages: Messages) -> tuple[list[int], list[int]] | RowError:
    try:
        enc = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
    except Exception as e:
        return RowError(f"chat template rejected the row: {str(e).splitlines()[0][:120]}")
    return list(enc["input_ids"]), [int(x) for x in enc["assistant_masks"]]


def encode_text(tokenizer, texts: list[str]) -> list[tuple[list[int], list[int]]]:
    """Plain text rows: the tokenizer's own special tokens, every token trained."""
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=True)
    return [(list(ids), [1] * len(ids)) for ids in enc["input_ids"]]


def generation_prompt(tokenizer, messages: Messages) -> str:
    """The rendering up to where the next assistant answer starts."""
    return render(tokenizer, messages, add_generation_prompt=True)


def user_turn_prefix(tokenizer, system: str | None = None) -> str:
    """The rendering up to where the first user message's text starts (for target-written prompts).

    Found by rendering a sentinel user message and cutting at it, so no separator is hard-coded.
    """
    sentinel = "\u2063draftheads-sentinel\u2063"
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": sentinel}
    ]
    text = render(tokenizer, msgs)
    if sentinel not in text:
        raise UserError(
            "the chat template does not render the user message verbatim; use distill.source=data"
        )
    return text[: text.index(sentinel)]
