"""How far a call may go in the target's positions, and the tree depth that keeps it there.

A request of ``n_prompt`` real prompt tokens and ``max_new_tokens`` new ones fits when
``n_prompt + max_new_tokens <= limit`` (the target's ``max_position_embeddings``, GPT-2's
``n_positions``); a longer one is refused in one line, where ``generate`` would run past its
position table. A tree verify feeds node d of a row at position ``pos + d``; capping each row's
depth at ``min(left - 1, limit - 1 - pos)`` (``left``: tokens the row may still emit, the bonus
included) keeps every position below the limit and never drafts a token the row cannot emit.

RoPE scalings whose frequencies depend on ``max(position_ids)`` (``longrope``, ``dynamic``)
switch as soon as a forward reaches their original length: ``generate`` crosses it one token at
a time, a tree verify a few positions early, and the two would diverge. Requests that stay
within that length are decoded as usual; longer ones are refused.
"""

from __future__ import annotations

import torch

from draftheads.conf.errors import UserError
from draftheads.decode.tree import Tree


def position_limit(config) -> int | None:
    """The target's number of positions (``max_position_embeddings``, GPT-2's ``n_positions``)."""
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def rope_switch(config) -> tuple[str, int] | None:
    """``(rope type, positions)`` when the target's RoPE frequencies change once a forward's
    ``max(position_ids) + 1`` passes ``positions``; None for every other position encoding."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return None
    per_layer = [p for p in params.values() if isinstance(p, dict)] or [params]
    for p in per_layer:
        kind = str(p.get("rope_type", p.get("type", "default")))
        if kind == "longrope":
            return kind, int(p.get("original_max_position_embeddings") or position_limit(config) or 0)
        if "dynamic" in kind:
            return kind, int(position_limit(config) or 0)
    return None


def check_request(config, n_prompt: int, max_new_tokens: int) -> None:
    """Refuse a request whose prompt and new tokens do not fit the target's positions."""
    total = n_prompt + max_new_tokens
    switch = rope_switch(config)
    if switch is not None and total > switch[1]:
        kind, length = switch
        raise UserError(
            f"the target's {kind} RoPE scaling changes its frequencies past {length} positions, which a "
            f"tree verify reaches early; keep prompt + max_new_tokens <= {length} (now {total}) or use "
            "target.generate"
        )
    limit = position_limit(config)
    if limit is not None and total > limit:
        raise UserError(
            f"prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) = {total} exceeds the "
            f"target's {limit} positions; use max_new_tokens <= {max(limit - n_prompt, 0)} or a shorter prompt"
        )


def fit_new_tokens(
    n_prompt: int, max_new_tokens: int, limit: int | None, key: str = "max_new_tokens"
) -> tuple[int, str | None]:
    """``max_new_tokens`` cut to the room the prompt leaves in the target's ``limit`` positions,
    and a one-line note when it was cut; a prompt that leaves no room is refused."""
    if limit is None or n_prompt + max_new_tokens <= limit:
        return max_new_tokens, None
    if n_prompt >= limit:
        raise UserError(
            f"the prompt is {n_prompt} tokens and the target's context is {limit}; shorten the prompt"
        )
    room = limit - n_prompt
    return room, (
        f"note: prompt ({n_prompt} tokens) + {key} ({max_new_tokens}) exceed the target's context of "
        f"{limit} tokens; the answer stops at {room} new tokens"
    )


def depth_caps(left: list[int], positions: list[int], limit: int | None) -> list[int]:
    """Per row, the deepest tree node worth verifying: ``left - 1`` drafts (the bonus is the
    last token the row may emit) and no node at or past position ``limit``."""
    caps = [n - 1 for n in left]
    if limit is not None:
        caps = [min(c, limit - 1 - p) for c, p in zip(caps, positions)]
    return [max(c, 0) for c in caps]


def cap_depth(tree: Tree, caps: torch.Tensor) -> Tree:
    """Turn every node deeper than its row's cap ``[B]`` into padding (the root stays).

    A node deeper than the cap has only deeper descendants, so the nodes left are closed under
    ancestors. Padding is what :func:`draftheads.decode.select.prune` pads with: an invalid node
    under the root with the root's token and score 0, at depth 1 (0 where the cap is 0, so its
    position is the root's). Indices are unchanged and nothing is read back to the host.
    """
    deep = tree.depths > caps[:, None]
    return Tree(
        torch.where(deep, tree.tokens[:, :1], tree.tokens),
        torch.where(deep, 0, tree.parents),
        torch.where(deep, caps.clamp(max=1)[:, None], tree.depths),
        torch.where(deep, 0.0, tree.scores),
        tree.valid & ~deep,
    )
