"""Speed and τ under sampling, beside greedy: the rows ``eval`` adds for each of ``eval.temperatures``.

Most chat deployments sample (temperature 0.7-1.0), and there a drafted token is accepted with
the rejection-sampling rule, less often than under greedy. Per temperature, each prompt's first
turn is decoded, back to back, with the two plain sampling loops on the decoder's backend (the
target's ``generate`` and the retiring batched loop; the faster is the baseline,
:mod:`draftheads.decode.baseline`) and with the speculative generator; all are seeded alike. They
draw their samples differently, so their texts differ and there is no identity check here: that
the speculative text follows the target's distribution exactly is what the sampling-distribution
tests prove. Tokens per second count each method's own new tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.baseline import fastest, timed_generate, timed_retiring
from draftheads.decode.context import fit_new_tokens, position_limit
from draftheads.decode.evaluate import timed
from draftheads.decode.prompting import encode_prompt


def new_tokens(row: torch.Tensor, eos: int | None, pad: int | None) -> int:
    """New tokens of one generated row: up to its first EOS (inclusive), trailing padding dropped."""
    t = row.tolist()
    if eos is not None and eos in t:
        return t.index(eos) + 1
    while t and pad is not None and t[-1] == pad:
        t.pop()
    return len(t)


@torch.no_grad()
def sample_rows(
    gen,
    target: nn.Module,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    temperatures: list[float],
    seed: int = 0,
) -> list[dict]:
    """One row per temperature: τ, speculative and both plain loops' tokens/s (same backend), the
    speedup against the faster plain loop."""
    device = next(target.parameters()).device
    limit = position_limit(target.config)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = []
    for temperature in temperatures:
        kw = dict(do_sample=True, temperature=temperature, eos_token_id=eos)
        spec_s = base_s = retire_s = 0.0
        spec_n = base_n = retire_n = 0
        retired = True  # the retiring loop samples this distribution (every prompt)
        lengths: list[int] = []
        for i, p in enumerate(prompts):
            ids = encode_prompt(tokenizer, [{"role": "user", "content": p.turns[0]}]).to(device)
            new, _ = fit_new_tokens(ids.shape[1], max_new_tokens, limit)
            mask = torch.ones_like(ids)
            torch.manual_seed(seed + i)
            ref = timed_generate(
                target, gen.backend, gen.packs, ids, mask, max_new_tokens=new, pad_token_id=pad, **kw
            )
            base_s, base_n = (
                base_s + ref.seconds,
                base_n + new_tokens(ref.output[0, ids.shape[1] :], eos, pad),
            )
            torch.manual_seed(seed + i)
            run = timed_retiring(
                target, gen.backend, gen.packs, ids, mask, max_new_tokens=new, pad_token_id=pad, **kw
            )
            retired &= run is not None
            if run is not None:
                retire_s, retire_n = retire_s + run.seconds, retire_n + run.new_tokens
            torch.manual_seed(seed + i)
            _, s = timed(gen.generate, ids, max_new_tokens=new, **kw)
            spec_s, spec_n = spec_s + s, spec_n + gen.last_stats.new_tokens
            lengths += gen.last_stats.accepted_lengths
        spec_rate, generate_rate = spec_n / max(spec_s, 1e-9), base_n / max(base_s, 1e-9)
        retiring_rate = retire_n / max(retire_s, 1e-9) if retired else None
        baseline, base_rate = fastest(generate_rate, retiring_rate)
        rows.append(
            {
                "temperature": temperature,
                "tau": sum(lengths) / max(len(lengths), 1),
                "tokens_per_s": spec_rate,
                "baseline_tokens_per_s": base_rate,
                "baseline": baseline,
                "generate_tokens_per_s": generate_rate,
                "retiring_tokens_per_s": retiring_rate,
                "speedup": spec_rate / base_rate if base_rate else 0.0,
                "num_prompts": len(prompts),
                "num_new_tokens": spec_n,
                "backend": gen.backend,
            }
        )
    return rows


def run_sampling(
    target: nn.Module,
    tokenizer,
    drafter: nn.Module | None,
    prompts: list,
    decode: DecodeConfig,
    temperatures: list[float],
) -> list[dict]:
    """Warm up, then :func:`sample_rows` for ``drafter`` (None: lookup alone) on ``decode``'s settings."""
    from draftheads.decode import SpeculativeGenerator

    if not temperatures:
        return []
    gen = SpeculativeGenerator(target, drafter, tokenizer=tokenizer, config=decode)
    ids = encode_prompt(tokenizer, "Hello").to(next(target.parameters()).device)
    gen.generate(ids, max_new_tokens=4, do_sample=True, temperature=temperatures[0])  # one-off costs
    timed_retiring(
        target, gen.backend, gen.packs, ids, torch.ones_like(ids), max_new_tokens=4, do_sample=True
    )
    return sample_rows(gen, target, tokenizer, prompts, decode.max_new_tokens, temperatures, decode.seed)


def format_rows(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| temperature | τ | tok/s | generate tok/s (backend) | retiring loop tok/s (backend) "
        "| speedup vs fastest plain | new tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['temperature']} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} "
        f"| {r.get('generate_tokens_per_s', r['baseline_tokens_per_s']):.1f} "
        f"| {'-' if r.get('retiring_tokens_per_s') is None else format(r['retiring_tokens_per_s'], '.1f')} "
        f"| {r['speedup']:.2f}× ({r.get('baseline', 'generate')}) | {r['num_new_tokens']} |"
        for r in rows
    ]
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """One line: τ and speedup (against the faster plain sampling loop, named) at each temperature."""
    return "  ".join(
        f"T={r['temperature']}: τ {r['tau']:.2f} speedup {r['speedup']:.2f}× vs plain {r.get('baseline', 'generate')}"
        for r in rows
    )
