"""τ and tokens/s of the speculative generator against the target's plain greedy ``generate``.

Reusable from Python (``measure_speed``) and runnable as a short benchmark::

    python -m draftheads.decode.speed --heads DIR [--tiny llama] [--batch 1 4 8] [--new 64] [--prompts 8]
    python -m draftheads.decode.speed --heads DIR --batch 1 --dynamic 4,4,8 4,5,12 3,3,6   # EAGLE-2 trees

Both methods decode the same chat-templated prompts back to back in one process, batch by
batch (left-padded), greedy; the table also says whether the outputs were identical.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode.commands import BUILTIN_PROMPTS, encode_prompt
from draftheads.decode.generator import SpeculativeGenerator


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
    """One row per batch size: baseline and speculative tokens/s, speedup, τ, identical outputs."""
    gen = SpeculativeGenerator(target, drafter, tok, config, tree_dir=tree_dir)
    dev = next(target.parameters()).device
    warm, warm_mask = next(_batches(tok, prompts[:1], 1))  # first calls pay one-off setup costs
    target.generate(warm.to(dev), attention_mask=warm_mask.to(dev), max_new_tokens=4, do_sample=False)
    gen.generate(warm.to(dev), warm_mask.to(dev), max_new_tokens=4)
    rows = []
    for bs in batch_sizes:
        base_t = spec_t = 0.0
        base_n = spec_n = 0
        lengths: list[int] = []
        same = True
        for ids, mask in _batches(tok, prompts, bs):
            ids, mask = ids.to(dev), mask.to(dev)
            t0 = time.perf_counter()
            ref = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
            base_t += time.perf_counter() - t0
            out = gen.generate(ids, mask, max_new_tokens=max_new_tokens)
            s = gen.last_stats
            spec_t += s.total_time_s
            spec_n += s.new_tokens
            lengths += s.accepted_lengths
            P = ids.shape[1]
            pad = gen._pad_id()
            base_n += int((ref[:, P:] != pad).sum())
            n = min(ref.shape[1], out.shape[1])
            same &= torch.equal(ref[:, P:n], out[:, P:n])
        rows.append(
            {
                "batch": bs,
                "baseline_tok_s": base_n / base_t,
                "spec_tok_s": spec_n / spec_t,
                "speedup": (spec_n / spec_t) / (base_n / base_t),
                "tau": sum(lengths) / max(len(lengths), 1),
                "identical": same,
            }
        )
    return rows


def format_rows(rows: list[dict]) -> str:
    head = "| batch | greedy generate tok/s | speculative tok/s | speedup | τ | identical |\n|---|---|---|---|---|---|"
    body = [
        f"| {r['batch']} | {r['baseline_tok_s']:.1f} | {r['spec_tok_s']:.1f} | {r['speedup']:.2f}× | {r['tau']:.2f} | {r['identical']} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> None:
    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads import Drafter, load_target
    from draftheads.heads.base import resolve_checkpoint_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", required=True)
    ap.add_argument("--tiny", default=None, help="a tiny random target (llama, gpt2, ...) instead of SmolLM2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tree", default="auto")
    ap.add_argument(
        "--dynamic",
        nargs="+",
        default=None,
        metavar="K,DEPTH,TOTAL",
        help="EAGLE-2 tree settings to compare (top_k_draft,depth,total_tokens), one table each",
    )
    a = ap.parse_args(argv)
    tcfg = TargetConfig(device=a.device, dtype=a.dtype)
    if a.tiny:
        tcfg = TargetConfig(name_or_path=f"tiny-{a.tiny}", tiny=a.tiny, device=a.device, dtype=a.dtype)
    target, tok = load_target(tcfg)
    directory = resolve_checkpoint_dir(a.heads)
    drafter = Drafter.from_pretrained(directory, target=target, tokenizer=tok, map_location=target.device)
    prompts = (BUILTIN_PROMPTS * (a.prompts // len(BUILTIN_PROMPTS) + 1))[: a.prompts]
    configs = [DecodeConfig(tree=a.tree)]
    if a.dynamic:
        configs = [DecodeConfig(tree=a.tree, **dynamic_setting(text)) for text in a.dynamic]
    for cfg in configs:
        rows = measure_speed(target, drafter, tok, prompts, tuple(a.batch), a.new, cfg, str(directory))
        if a.dynamic:
            print(f"top_k_draft={cfg.top_k_draft} depth={cfg.depth} total_tokens={cfg.total_tokens}")
        print(format_rows(rows), flush=True)


def dynamic_setting(text: str) -> dict[str, int]:
    """``"K,DEPTH,TOTAL"`` -> the DecodeConfig fields of an EAGLE-2 dynamic tree."""
    try:
        k, depth, total = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--dynamic {text!r}: give top_k_draft,depth,total_tokens, e.g. 4,4,8") from None
    return {"top_k_draft": k, "depth": depth, "total_tokens": total}


if __name__ == "__main__":
    main()
