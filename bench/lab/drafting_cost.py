"""What a drafter's depth costs per decoding step, in 1-token greedy steps of the target.

A deeper drafter learns more per token of data but drafts slower, and on a CPU drafting is most
of what a step pays for. This measures that price alone: for each depth it builds a drafter of
the shape the recipe would train (untrained: the cost of a pass does not depend on the weights),
decodes the embedded prompts with it through the decoder (its backend, no lookup branch, no
planner, so that every step drafts), and divides the drafting time per drafting step by the
target's measured 1-token step (the decoder's cost curve)::

    python -m bench.lab.drafting_cost                     # SmolLM2-135M, DFlash 1/2/3/5 layers, EAGLE-3 1 layer
    python -m bench.lab.drafting_cost --target tiny-llama --depths 1 2 --tokens 8

Run it on a quiet machine (nothing else on the cores): the figures are ratios from one process.
"""

from __future__ import annotations

import argparse

import torch

from draftheads.bench.decode_speed import BUILTIN_PROMPTS
from draftheads.conf.commands.compose import compose
from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.prompting import encode_prompt
from draftheads.heads.target.load import load_target
from draftheads.train.drafters import build_drafter


def drafting_steps(target, tok, drafter, prompts: list[str], new_tokens: int) -> float:
    """Drafting seconds per drafting step ÷ the target's 1-token step, over ``prompts``."""
    decode = DecodeConfig(lookup=False, cost_aware=False, max_new_tokens=new_tokens)
    gen = SpeculativeGenerator(target, drafter, tokenizer=tok, config=decode)
    drafted, seconds = 0, 0.0
    for i, p in enumerate(prompts):
        gen.generate(encode_prompt(tok, p), max_new_tokens=new_tokens)
        if i == 0:
            continue  # the first prompt warms the backend's packed weights up
        s = gen.last_stats
        drafted += s.steps - s.undrafted_steps
        seconds += s.draft_time_s
    return seconds / max(drafted, 1) / gen.cost_curve()(1)


def depth_row(layers: int) -> list[str]:
    """``draft=dflash`` at ``layers`` layers over z-lab's spread feature layers (EAGLE-3's three at
    one layer)."""
    return [
        "draft=dflash",
        f"draft.dflash.num_decoder_layers={layers}",
        f"draft.dflash.feature_rule={'spread' if layers > 1 else 'eagle3'}",
    ]


def build(target_name: str, overrides: list[str], target, tok) -> object:
    """An untrained drafter of the recipe's shape (the draft ``overrides`` on their group's defaults)."""
    torch.manual_seed(0)
    cfg, _ = compose([f"target={target_name}", *overrides])
    return build_drafter(cfg, target, tok)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2", help="a conf/target name (smollm2, tiny-llama, ...)")
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 5], help="DFlash drafter layers")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per prompt")
    ap.add_argument("--prompts", type=int, default=5, help="embedded prompts (the first one warms up)")
    args = ap.parse_args(argv)
    target, tok = load_target(compose([f"target={args.target}"])[0].target)
    prompts = BUILTIN_PROMPTS[: max(args.prompts, 2)]
    rows = [(["draft=eagle3"], 1)] + [(depth_row(n), n) for n in args.depths]
    print("| drafter | layers | drafting, greedy steps |\n|---|---|---|")
    for overrides, layers in rows:
        drafter = build(args.target, overrides, target, tok)
        steps = drafting_steps(target, tok, drafter, prompts, args.tokens)
        print(f"| {overrides[0].removeprefix('draft=')} | {layers} | {steps:.3f} |", flush=True)


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
