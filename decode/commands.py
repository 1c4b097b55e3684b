"""``draftheads generate`` (stream a speculative answer) and ``draftheads tree`` (pick a Medusa tree)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.generator import SpeculativeGenerator
from draftheads.decode.tree import TREE_FILE, best_tree, expected_tokens
from draftheads.heads.masks import additive_mask, causal

# Used by `draftheads tree` only when draftheads.data.prompts is not available.
BUILTIN_PROMPTS = [
    "Explain what a KV cache is in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is 17 times 23? Show your steps.",
    "Give three tips for writing clear emails.",
    "Summarise the plot of Romeo and Juliet.",
    "How do I reverse a list in Python?",
    "Name the planets of the solar system in order.",
    "What causes the seasons on Earth?",
]
COST_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def _load(cfg: Config):
    from draftheads.heads import Drafter, load_target
    from draftheads.heads.base import resolve_checkpoint_dir

    if not cfg.heads:
        raise UserError("this command needs heads=DIR (a checkpoint directory or a hub id ORG/NAME)")
    directory = resolve_checkpoint_dir(cfg.heads, cfg.revision)
    target, tok = load_target(cfg.target)
    drafter = Drafter.from_pretrained(directory, target=target, tokenizer=tok, map_location=target.device)
    return target, tok, drafter, directory


def encode_prompt(tok, text: str, chat: bool = True) -> torch.Tensor:
    """``[1, P]`` ids of a user prompt, chat-templated when the tokenizer has a template."""
    if chat and getattr(tok, "chat_template", None):
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return tok(rendered, return_tensors="pt", add_special_tokens=False).input_ids
    return tok(text, return_tensors="pt").input_ids


# ---- draftheads generate ---------------------------------------------------------------------------
def generate(cfg: Config) -> None:
    """Stream the answer to ``prompt=`` as it is accepted, then print τ and tokens/s."""
    if not cfg.prompt:
        raise UserError('draftheads generate needs prompt="..."')
    target, tok, drafter, directory = _load(cfg)
    gen = SpeculativeGenerator(target, drafter, tok, cfg.decode, tree_dir=str(directory))
    ids = encode_prompt(tok, cfg.prompt, cfg.decode.chat).to(target.device)
    torch.manual_seed(cfg.decode.seed)
    out: list[int] = []
    shown = 0
    for step in gen.stream(ids):
        out += step[0]
        text = tok.decode(out, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(text[shown:])
            sys.stdout.flush()
            shown = len(text)
    s = gen.last_stats
    print(
        f"\n\n[{s.new_tokens} tokens in {s.total_time_s:.2f}s: {s.tokens_per_s:.1f} tokens/s, "
        f"tau {s.tau:.2f} over {s.target_forwards - 1} steps (+1 prefill), "
        f"draft {s.draft_time_s:.2f}s / verify {s.verify_time_s:.2f}s]"
    )


# ---- draftheads tree -------------------------------------------------------------------------------
def heldout_prompts(tok, n: int) -> tuple[list[str], str]:
    """Held-out user prompts from the data package; a few built-in ones if it is missing."""
    try:
        from draftheads.data.prompts import load_prompts
    except ImportError:
        return BUILTIN_PROMPTS[:n], "built-in prompts (draftheads.data.prompts is not available)"
    rows = load_prompts("heldout", max_prompts=n, tokenizer=tok)
    return [r.turns[0] for r in rows], f"{len(rows)} held-out prompts"


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def verify_cost_curve(
    target, sizes: tuple[int, ...] = COST_SIZES, prefix: int = 200, repeats: int = 7
) -> dict[int, float]:
    """Seconds of one target forward over ``T`` new tokens with ``prefix`` tokens cached (median)."""
    from transformers import DynamicCache

    from draftheads.decode import kv

    p = next(target.parameters())
    dev, dtype = p.device, p.dtype
    vocab = target.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, prefix + max(sizes)), generator=torch.Generator().manual_seed(0)).to(
        dev
    )
    cache = DynamicCache()
    allowed = causal(prefix, dev)[None]
    target(ids[:, :prefix], attention_mask=additive_mask(allowed, dtype), cache=cache, use_cache=True)
    costs = {}
    for T in sizes:
        allowed = torch.ones(T, prefix + T, dtype=torch.bool, device=dev).tril(prefix)[None]
        mask = additive_mask(allowed, dtype)
        pos = torch.arange(prefix, prefix + T, device=dev)[None]
        times = []
        for _ in range(repeats + 1):
            _sync(dev)
            t0 = time.perf_counter()
            target(
                ids[:, prefix : prefix + T],
                attention_mask=mask,
                position_ids=pos,
                cache=cache,
                use_cache=True,
            )
            _sync(dev)
            times.append(time.perf_counter() - t0)
            kv.truncate(cache, prefix)
        costs[T] = statistics.median(times[1:])
    return costs


@torch.no_grad()
def medusa_draft_cost(drafter, depth: int, topk: int, repeats: int = 7) -> float:
    """Seconds to draft one Medusa tree: ResBlocks at one position plus ``depth`` head logits + top-k."""
    p = next(drafter.parameters())
    h = torch.randn(1, drafter.target_fingerprint.hidden_size, device=p.device, dtype=p.dtype)
    times = []
    for _ in range(repeats + 1):
        _sync(p.device)
        t0 = time.perf_counter()
        hh = drafter.head_hidden(h)
        for k in range(depth):
            drafter.head_logits(k, hh[k]).topk(topk, dim=-1)
        _sync(p.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


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


def tree(cfg: Config) -> None:
    """Measure per-head top-k accuracies on held-out prompts and save the best tree as tree.json.

    ``decode.tree_size=N`` picks the best N-token tree; ``decode.tree_size=0`` measures the
    target's verification cost curve on this device and picks the size maximising tokens/s.
    """
    dc: DecodeConfig = cfg.decode
    target, tok, drafter, directory = _load(cfg)
    if drafter.kind != "medusa":
        raise UserError(
            "draftheads tree builds trees for Medusa heads; EAGLE drafters use EAGLE-2 dynamic trees "
            "(decode.dynamic=true) or a tree given with decode.tree=[[0],[0,0],...]"
        )
    if dc.tree_size < 0 or dc.tree_topk < 1:
        raise UserError(
            f"decode.tree_size={dc.tree_size}, tree_topk={dc.tree_topk}: need size >= 0 and topk >= 1"
        )
    prompts, source = heldout_prompts(tok, dc.tree_prompts)
    print(f"measuring head accuracies on {source}, {dc.tree_new_tokens} greedy tokens each")
    acc = head_accuracies(target, drafter, tok, prompts, dc.tree_new_tokens, dc.tree_topk)
    for k, row in enumerate(acc):
        print(f"  head {k}: top-1 {row[0]:.3f}  top-{dc.tree_topk} {sum(row):.3f}")
    record: dict = {"source": source, "accuracies": acc}
    if dc.tree_size == 0:
        costs = verify_cost_curve(target, tuple(s for s in COST_SIZES if s <= dc.tree_max_size))
        draft = medusa_draft_cost(drafter, drafter.num_heads, dc.tree_topk)
        size, table = pick_size(acc, costs, draft, dc.tree_max_size)
        record.update(device=str(target.device), verify_cost_s=costs, draft_cost_s=draft)
        print(f"verification cost on {target.device} (relative to 1 token, {costs[1] * 1e3:.1f} ms):")
        print("  " + "  ".join(f"{t}:{c / costs[1]:.2f}" for t, c in costs.items()))
        for r in table:
            if r["size"] in costs or r["size"] == size:
                print(f"  size {r['size']:>3}: tau {r['tau']:.2f}, expected {r['tokens_per_s']:.1f} tokens/s")
    else:
        size = dc.tree_size
    choices = best_tree(acc, max(size - 1, 1))
    record.update(size=len(choices) + 1, expected_tau=expected_tokens(acc, choices), choices=choices)
    local = Path(str(cfg.heads)).expanduser().is_dir()
    out = Path(cfg.out) if cfg.out else (directory / TREE_FILE if local else Path(TREE_FILE))
    if out.is_dir():
        out = out / TREE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"tree of {record['size']} tokens (expected tau {record['expected_tau']:.2f}) saved to {out}")
    if not local and not cfg.out:
        print(f"(heads= is a hub id; pass decode.tree={out} to use it)")
