"""The one way a user prompt becomes target input ids for decoding.

The chat rendering is the data pipeline's own (:func:`draftheads.data.chat.generation_prompt`),
so a drafter is decoded on exactly the prompt format it was trained on.
"""

from __future__ import annotations

import torch

from draftheads.data.chat import generation_prompt, has_template

Messages = list[dict[str, str]]


def encode_prompt(tok, prompt: str | Messages, chat: bool = True) -> torch.Tensor:
    """``[1, P]`` ids of a prompt (a user message or a whole conversation), ready for the answer.

    Chat-templated with the generation prompt when ``chat`` and the tokenizer has a template;
    otherwise the plain text of the (last) user message.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if chat and has_template(tok):
        text = generation_prompt(tok, messages)
        return tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    return tok(messages[-1]["content"], return_tensors="pt").input_ids
