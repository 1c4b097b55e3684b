"""τ and tokens/s of the speculative generator against plain greedy decoding: the fastest plain
loop on the decoder's backend (the baseline: transformers' ``generate`` or the retiring batched
loop, whichever ran faster, :mod:`draftheads.decode.baseline`) and stock ``generate`` (eager,
what a user has without draftheads).

Reusable from Python (``measure_speed``) and runnable as a short benchmark::

    draftheads speed heads=DIR [target=tiny-llama] [speed.batch_sizes=[1,4,8]] [decode.max_new_tokens=64]
    draftheads speed heads=DIR speed.batch_sizes=[1] speed.dynamic=[[4,4,8],[4,5,12]]  # dynamic trees

Every method decodes the same chat-templated prompts back to back in one process, batch by
batch (left-padded), greedy; the table shows every plain loop's tokens/s and says whether the
outputs were identical (to ``generate`` on the backend, and to stock).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import torch

from draftheads.conf.commands.args import SpeedArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import backend as backends
from draftheads.decode.baseline import fastest, timed_generate, timed_retiring
from draftheads.decode.generator import SpeculativeGenerator
from draftheads.decode.prompting import encode_prompt

# A fixed, varied prompt set: the measurement needs no data download.
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


def _batches(tok, prompts: list[str], size: int):
    for i in range(0, len(prompts), size):
        rows = [encode_prompt(tok, p)[0].tolist() for p in prompts[i : i + size]]
        width = max(map(len, rows))
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        yield ids, mask


@torch.no_grad()
def measure_speed(
    target,
    drafter,
    tok,
    prompts: list[str],
    batch_sizes: tuple[int, ...] = (1, 4, 8),
    max_new_tokens: int = 64,
    config: DecodeConfig | None = None,
    tree_dir: str | None = None,
) -> list[dict]:
    """One row per batch size: stock, same-backend ``generate``, retiring-loop and speculative
    tokens/s, the speedups (against the faster same-backend loop, and stock), τ, and whether the
    outputs were identical (to same-backend ``generate``, and to stock)."""
    gen = SpeculativeGenerator(target, drafter, tok, config, tree_dir=tree_dir)
    for line in gen.backend_lines():
        print(line, file=sys.stderr)
    dev = next(target.parameters()).device
    warm, warm_mask = next(_batches(tok, prompts[:1], 1))  # first calls pay one-off setup costs
    for name in ("eager", gen.backend):
        with backends.applied(name, target):
            target.generate(warm.to(dev), attention_mask=warm_mask.to(dev), max_new_tokens=4, do_sample=False)
    timed_retiring(target, gen.backend, gen.packs, warm.to(dev), warm_mask.to(dev), max_new_tokens=4)
    gen.generate(warm.to(dev), warm_mask.to(dev), max_new_tokens=4)
    rows = []
    for bs in batch_sizes:
        base_t = spec_t = stock_t = retire_t = draft_t = verify_t = 0.0  # retire_t < 0: not run
        base_n = spec_n = steps = greedy_steps = 0
        lengths: list[int] = []
        same = same_stock = True
        for ids, mask in _batches(tok, prompts, bs):
            ids, mask = ids.to(dev), mask.to(dev)
            kw = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=gen.pad_id())
            t0 = time.perf_counter()
            stock = target.generate(ids, attention_mask=mask, **kw)
            stock_t += time.perf_counter() - t0
            run = timed_generate(target, gen.backend, gen.packs, ids, mask, **kw)
            ref, base_t = run.output, base_t + run.seconds
            plain = timed_retiring(target, gen.backend, gen.packs, ids, mask, **kw)
            retire_t = retire_t + plain.seconds if plain is not None and retire_t >= 0 else -1.0
            out = gen.generate(ids, mask, max_new_tokens=max_new_tokens)
            s = gen.last_stats
            spec_t += s.total_time_s
            spec_n += s.new_tokens
            draft_t, verify_t, steps = draft_t + s.draft_time_s, verify_t + s.verify_time_s, steps + s.steps
            greedy_steps += ref.shape[1] - ids.shape[1] - 1  # forwards after the prefill
            lengths += s.accepted_lengths
            P = ids.shape[1]
            pad = gen.pad_id()
            base_n += int((ref[:, P:] != pad).sum())
            n = min(ref.shape[1], out.shape[1])
            same &= torch.equal(ref[:, P:n], out[:, P:n])
            same_stock &= torch.equal(stock[:, P:n], out[:, P:n])
        # greedy: every plain loop emits the same tokens, so each rate counts generate's
        retiring = base_n / retire_t if retire_t > 0 else None
        baseline, base_rate = fastest(base_n / base_t, retiring)
        rows.append(
            {
                "batch": bs,
                "backend": gen.backend,
                "stock_tok_s": base_n / stock_t,
                "generate_tok_s": base_n / base_t,
                "retiring_tok_s": retiring,
                "baseline": baseline,
                "baseline_tok_s": base_rate,
                "spec_tok_s": spec_n / spec_t,
                "speedup": (spec_n / spec_t) / base_rate,
                "speedup_vs_stock": (spec_n / spec_t) / (base_n / stock_t),
                "tau": sum(lengths) / max(len(lengths), 1),
                "identical": same,
                "identical_to_stock": same_stock,
                "draft_ms": 1e3 * draft_t / max(steps, 1),
                "verify_ms": 1e3 * verify_t / max(steps, 1),
                # a step's cost in generate's greedy steps on the same backend (its time per forward)
                "step_cost": (draft_t + verify_t) / max(steps, 1) / (base_t / max(greedy_steps, 1)),
                "draft_cost": draft_t / max(steps, 1) / (base_t / max(greedy_steps, 1)),
            }
        )
    return rows


def rate(value: float | None) -> str:
    """A tokens/s cell (``-``: the loop did not run)."""
    return "-" if value is None else f"{value:.1f}"


def format_rows(rows: list[dict]) -> str:
    """The rows as a Markdown table: the speedup is against the faster plain loop on the backend
    (named in its column), the stock one against eager ``generate``."""
    head = (
        "| batch | backend | stock generate tok/s | generate tok/s (backend) | retiring loop tok/s (backend) "
        "| speculative tok/s | speedup vs stock | speedup vs fastest plain | τ | draft ms/step | verify ms/step "
        "| step cost (greedy steps) | draft cost (greedy steps) | identical | identical to stock |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    body = [
        f"| {r['batch']} | {r['backend']} | {r['stock_tok_s']:.1f} | {r.get('generate_tok_s', r['baseline_tok_s']):.1f} "
        f"| {rate(r.get('retiring_tok_s'))} | {r['spec_tok_s']:.1f} | {r['speedup_vs_stock']:.2f}× "
        f"| {r['speedup']:.2f}× ({r.get('baseline', 'generate')}) | {r['tau']:.2f} | {r['draft_ms']:.1f} | {r['verify_ms']:.1f} "
        f"| {r['step_cost']:.2f} | {r['draft_cost']:.2f} | {r['identical']} | {r['identical_to_stock']} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def speed(args: SpeedArgs) -> None:
    """``draftheads speed``: one table per decode setting (``speed.dynamic`` compares dynamic trees)."""
    from draftheads.conf.commands.decode import load_decodable
    from draftheads.heads import Drafter
    from draftheads.heads.base import resolve_checkpoint_dir

    if not args.heads:
        raise UserError(
            "draftheads speed needs heads=DIR (a checkpoint directory or a hub id), or heads=none"
        )
    configs = [replace(args.decode, **dynamic_setting(text)) for text in args.speed.dynamic] or [args.decode]
    target, tok = load_decodable(args.target)
    directory, drafter = None, None
    if args.heads != "none":
        directory = resolve_checkpoint_dir(args.heads, args.revision)
        drafter = Drafter.from_pretrained(directory, target=target, tokenizer=tok, map_location=target.device)
    if args.speed.curve:
        print(format_curves(target, args.decode.backend, args.decode.cost_cache), flush=True)
    n = args.speed.prompts
    prompts = (BUILTIN_PROMPTS * (n // len(BUILTIN_PROMPTS) + 1))[:n]
    for dc in configs:
        rows = measure_speed(
            target,
            drafter,
            tok,
            prompts,
            tuple(args.speed.batch_sizes),
            dc.max_new_tokens,
            dc,
            directory and str(directory),
        )
        if args.speed.dynamic:
            print(f"top_k_draft={dc.top_k_draft} depth={dc.depth} total_tokens={dc.total_tokens}")
        print(format_rows(rows), flush=True)


def format_curves(target, backend: str, cache_dir: str | None) -> str:
    """The verify-cost curve on eager and on ``backend``: ms, and relative to eager's 1-token step."""
    from draftheads.decode.cost_cache import cached_curve

    dev, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    names = list(dict.fromkeys(["eager", backends.resolve(backend, dev, dtype)]))
    curves = {name: cached_curve(target, name, cache_dir) for name in names}
    base = curves["eager"].seconds[0]
    sizes = curves["eager"].sizes
    lines = [
        "verify-cost curve: ms for one target forward over n new tokens (relative to eager's 1 token)",
        "| backend | " + " | ".join(str(n) for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for name, c in curves.items():
        cells = [f"{1e3 * t:.1f} ({t / base:.2f})" for t in c.seconds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dynamic_setting(setting: list[int]) -> dict[str, int]:
    """``[K, DEPTH, TOTAL]`` (checked when ``speed.dynamic`` is read) -> the DecodeConfig fields
    of a dynamic tree (Li et al., 2024)."""
    k, depth, total = setting
    return {"top_k_draft": k, "depth": depth, "total_tokens": total}
