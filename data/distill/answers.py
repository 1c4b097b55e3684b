"""A batch of prompts answered by the target, turn by turn, within the target's positions.

Turn ``t`` of a conversation sees the answers to the turns before it. A prompt that cannot fit
the target's positions with ``max_new_tokens`` to spare is dropped before anything is generated
(:func:`fits`); a later turn that would pass them ends its conversation early (its ``finish``
gets "context"). An answer cut off by ``max_new_tokens`` (``finish`` "length") carries
``"unfinished": true`` in its message (``false`` otherwise): training then does not teach an
end-of-turn the target never produced there.
"""

from __future__ import annotations

from torch import nn

from draftheads.data.chat import generation_prompt
from draftheads.data.distill.generate import GenerateFn, GenParams
from draftheads.data.prompts import PromptRow


def max_positions(model: nn.Module) -> int | None:
    """The target's number of positions (``max_position_embeddings``; GPT-2's ``n_positions``)."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fits(tokenizer, prompt: PromptRow, limit: int | None, max_new_tokens: int) -> bool:
    """Whether the first turn's prompt plus ``max_new_tokens`` fits the target's positions."""
    if limit is None:
        return True
    text = generation_prompt(tokenizer, [{"role": "user", "content": prompt.turns[0]}])
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + max_new_tokens <= limit


def answer_batch(
    tokenizer,
    batch: list[PromptRow],
    generate: GenerateFn,
    params: GenParams,
    seed: int,
    limit: int | None = None,
) -> tuple[list[dict], int]:
    """Answer each row's user turns in order (turn t sees the answers to turns < t).

    A later turn whose prompt plus ``max_new_tokens`` would pass ``limit`` positions ends that
    conversation (``finish`` gets "context"); a cut-off answer is marked ``unfinished``.
    """
    chats: list[list[dict]] = [[] for _ in batch]
    finish: list[list[str]] = [[] for _ in batch]
    answer_ids: list[list[list[int]]] = [[] for _ in batch]
    ended: set[int] = set()
    n_new = 0
    for t in range(max(len(p.turns) for p in batch)):
        live, enc = [], []
        for i, p in enumerate(batch):
            if t >= len(p.turns) or i in ended:
                continue
            turn = [*chats[i], {"role": "user", "content": p.turns[t]}]
            ids = tokenizer(generation_prompt(tokenizer, turn), add_special_tokens=False)["input_ids"]
            if limit is not None and len(ids) + params.max_new_tokens > limit:
                ended.add(i)
                finish[i].append("context")
                continue
            chats[i] = turn
            live.append(i)
            enc.append(ids)
        if not live:
            continue
        answers, stopped = generate(enc, params, seed * 1000 + t)
        for i, ans, ok in zip(live, answers, stopped):
            n_new += len(ans)
            text = tokenizer.decode(ans, skip_special_tokens=True)
            # every answer carries the flag, so JSON readers infer one schema for all rows
            chats[i].append({"role": "assistant", "content": text, "unfinished": not ok})
            finish[i].append("stop" if ok else "length")
            answer_ids[i].append(ans)
    rows = [
        {
            "id": p.id,
            "category": p.category,
            "messages": chats[i],
            "finish": finish[i],
            "answer_ids": answer_ids[i],
        }
        for i, p in enumerate(batch)
    ]
    return rows, n_new
