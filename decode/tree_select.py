"""Choosing a static tree for heads: measured head accuracies, the device's step costs, the best size.

``draftheads tree`` reads this: :func:`select_tree` measures how often each head's rank-r
token is right on the target's own greedy text, and picks the tree that maximises expected
tokens per step (a given size) or per second (size 0: from :func:`profile_tree_costs`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import backend as backends
from draftheads.decode.kv import new_cache
from draftheads.decode.prompting import encode_prompt
from draftheads.decode.tree import best_tree, expected_tokens
from draftheads.heads.kinds import drafter_kind
from draftheads.heads.masks import additive_mask, causal

COST_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


@torch.no_grad()
def head_accuracies(
    target, drafter, tok, prompts: list[str], new_tokens: int, topk: int
) -> list[list[float]]:
    """acc[k][r]: how often head k's rank-r token is the target's greedy token (t + k + 2).

    Measured on the target's own greedy continuations of ``prompts``: one forward over prompt +
    continuation gives the heads' input at every position.
    """
    K = drafter.num_heads
    hits = torch.zeros(K, topk)
    totals = torch.zeros(K)
    for text in prompts:
        ids = encode_prompt(tok, text).to(target.device)
        full = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
        )
        P, L = ids.shape[1], full.shape[1]
        h = drafter.select_features(target(full, output_hidden_states=True).hidden_states)[0]
        hh = drafter.head_hidden(h[P - 1 :])  # positions P-1 .. L-1
        for k in range(K):
            n = L - P - k - 1  # positions t = P-1 .. with t + k + 2 <= L - 1
            if n <= 0:
                continue
            logits = drafter.head_logits(k, hh[k, :n]).float()
            true = full[0, P - 1 + k + 2 : P - 1 + k + 2 + n]
            rank = (logits > logits.gather(1, true[:, None])).sum(-1)
            hits[k] += torch.bincount(rank[rank < topk].cpu(), minlength=topk)[:topk].float()
            totals[k] += n
    return (hits / totals.clamp_min(1)[:, None]).tolist()


@torch.no_grad()
def profile_tree_costs(
    target, drafter, topk: int, sizes: tuple[int, ...] = COST_SIZES, prefix: int = 200, repeats: int = 7
) -> tuple[dict[int, float], float]:
    """Measured step costs on this device (median seconds), for choosing a tree size.

    Returns ``(verify, draft)``: ``verify[T]`` is one target forward over ``T`` new tokens with
    ``prefix`` tokens cached; ``draft`` is drafting one static tree (the heads' hidden states at one
    position, then every head's logits and top-``topk``).
    """
    p = next(target.parameters())
    dev, dtype = p.device, p.dtype

    def clock(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(repeats + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    vocab = target.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, prefix + max(sizes)), generator=gen).to(dev)
    cache = new_cache(target, keep=max(sizes))
    allowed = causal(prefix, dev)[None]
    target(ids[:, :prefix], attention_mask=additive_mask(allowed, dtype), cache=cache, use_cache=True)
    verify = {}
    for T in sizes:
        allowed = torch.ones(T, prefix + T, dtype=torch.bool, device=dev).tril(prefix)[None]
        mask, pos = additive_mask(allowed, dtype), torch.arange(prefix, prefix + T, device=dev)[None]

        def forward(T: int = T, mask: torch.Tensor = mask, pos: torch.Tensor = pos) -> None:
            new = ids[:, prefix : prefix + T]
            target(new, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
            cache.crop(prefix - cache.get_seq_length())

        verify[T] = clock(forward)
    d = next(drafter.parameters())
    h = torch.randn(1, drafter.target_fingerprint.hidden_size, device=d.device, dtype=d.dtype)

    def draft() -> None:
        hh = drafter.head_hidden(h)
        for k in range(drafter.num_heads):
            drafter.head_logits(k, hh[k]).topk(topk, dim=-1)

    return verify, clock(draft)


def interpolate(costs: dict[int, float], n: int) -> float:
    """Cost of an ``n``-token forward, linear between the measured sizes."""
    xs = sorted(costs)
    if n <= xs[0]:
        return costs[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if n <= b:
            return costs[a] + (costs[b] - costs[a]) * (n - a) / (b - a)
    return costs[xs[-1]] * n / xs[-1]


def pick_size(
    acc: list[list[float]], costs: dict[int, float], draft_cost: float, max_size: int
) -> tuple[int, list[dict]]:
    """The tree size (tokens incl. root) maximising expected tokens/s = τ(n) / (verify(n) + draft)."""
    table = []
    for n in range(1, max_size + 1):
        choices = best_tree(acc, n - 1)
        tau = expected_tokens(acc, choices)
        step = interpolate(costs, n) + (draft_cost if n > 1 else 0.0)
        table.append({"size": n, "tau": tau, "step_s": step, "tokens_per_s": tau / step})
    best = max(table, key=lambda r: r["tokens_per_s"])
    return best["size"], table


def select_tree(
    target, drafter, tok, prompts: list[str], dc: DecodeConfig, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Measure head accuracies on ``prompts`` and choose a tree; returns the tree.json record.

    ``dc.tree_size=N`` picks the best N-token tree; ``dc.tree_size=0`` measures this device's
    verification cost curve and picks the size maximising tokens/s.
    """
    if drafter.tree_width() is None:  # only heads that index a static tree have accuracies to measure
        drafter_is = drafter_kind(drafter.kind).describe_short(drafter.kind_config())
        raise UserError(
            f"draftheads tree builds trees for heads that index a static tree by depth, not {drafter_is}; "
            "decode it with dynamic trees (decode.dynamic=true) or a tree in decode.tree=[[0],[0,0],...]"
        )
    log(f"measuring head accuracies on {len(prompts)} prompts, {dc.tree_new_tokens} greedy tokens each")
    acc = head_accuracies(target, drafter, tok, prompts, dc.tree_new_tokens, dc.tree_topk)
    for k, row in enumerate(acc):
        log(f"  head {k}: top-1 {row[0]:.3f}  top-{dc.tree_topk} {sum(row):.3f}")
    record: dict[str, Any] = {"source": f"{len(prompts)} held-out prompts", "accuracies": acc}
    size = dc.tree_size
    if size == 0:
        sizes = tuple(s for s in COST_SIZES if s <= dc.tree_max_size)
        # priced on the backend the decoder will run (oneDNN's curve is much flatter than eager's)
        with backends.running(dc.backend, target, drafter) as chosen:
            costs, draft = profile_tree_costs(target, drafter, dc.tree_topk, sizes)
        size, table = pick_size(acc, costs, draft, dc.tree_max_size)
        record.update(device=str(target.device), backend=chosen, verify_cost_s=costs, draft_cost_s=draft)
        log(f"verification cost on {target.device}, {chosen} (relative to 1 token, {costs[1] * 1e3:.1f} ms):")
        log("  " + "  ".join(f"{t}:{c / costs[1]:.2f}" for t, c in costs.items()))
        for r in table:
            if r["size"] in costs or r["size"] == size:
                log(f"  size {r['size']:>3}: tau {r['tau']:.2f}, expected {r['tokens_per_s']:.1f} tokens/s")
    choices = best_tree(acc, max(size - 1, 1))
    record.update(size=len(choices) + 1, expected_tau=expected_tokens(acc, choices), choices=choices)
    return record
