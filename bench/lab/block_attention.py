"""Where a DFlash drafter's block position 1 looks: the attention mass of its first layer.

Position 1 predicts x_{a+1} from the anchor row x_a and the target's context before a. This
splits layer 0's attention of position 1 (averaged over heads and blocks) into the anchor row,
context position a−1, the whole context and the block's mask rows, with its entropy, on a
standard-library source text with the target's own features and the training mask::

    python -m bench.lab.block_attention outputs/bench/ablations/dflash/drafter [more drafters]
    python -m bench.lab.block_attention DIR --target tiny-llama --tokens 128

A drafter that has learnt its block gives the anchor a large share; one that spreads its
attention over the context predicts from the features alone.
"""

from __future__ import annotations

import argparse
import inspect
import math

import torch

from draftheads.conf.commands.compose import compose
from draftheads.conf.errors import UserError
from draftheads.heads import Drafter
from draftheads.heads.dflash import DFlashDrafter
from draftheads.heads.features import target_features
from draftheads.heads.target.load import load_target
from draftheads.train.modules.dflash_blocks import block_inputs, block_mask, block_positions


def position1_attention(d: DFlashDrafter, feats: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor):
    """Layer 0's softmax ``[heads, N, T + N*block]`` of every block's position 1 (keys: the context,
    then the blocks' rows), as training computes it."""
    T, bs = ids.shape[1], d.block_size
    layer, attn = d.layers[0], d.layers[0].self_attn
    ctx = d.fuse(feats.to(d.fc.weight.dtype))
    ctx_k, _ = attn.keys_values(ctx, *d.rotary_at(ctx, torch.arange(T)[None]))
    x = layer.input_layernorm(d.embed(block_inputs(ids, anchors, bs, d.mask_token_id)).to(ctx.dtype))
    cos, sin = d.rotary_at(x, block_positions(anchors, bs))
    q = attn.queries(x, cos, sin)
    k, _ = attn.keys_values(x, cos, sin)
    keys = torch.cat([ctx_k, k], 2).repeat_interleave(attn.heads // attn.kv_heads, 1)
    keep = torch.ones_like(anchors, dtype=torch.bool)
    mask = block_mask(anchors, keep, bs, torch.zeros(1, T, dtype=torch.long), torch.ones(1, T))
    scores = (q @ keys.transpose(-1, -2)) / math.sqrt(attn.head_dim)
    p = scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1)[0]
    return p[:, torch.arange(anchors.shape[1]) * bs + 1]


def shares(p: torch.Tensor, anchors: torch.Tensor, T: int, bs: int) -> dict[str, float]:
    """The mean attention on the anchor row, on context a−1, on all the context, and its entropy."""
    n = torch.arange(anchors.shape[1])
    context = p[..., :T].sum(-1).mean().item()
    anchor = p[:, n, T + n * bs].mean().item()
    return {
        "anchor row": anchor,
        "context a-1": p[:, n, anchors[0] - 1].mean().item(),
        "all context": context,
        "mask rows": 1 - context - anchor,
        "entropy": -(p.clamp_min(1e-12).log() * p).sum(-1).mean().item(),
    }


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("drafters", nargs="+", help="DFlash checkpoint directories")
    ap.add_argument("--target", default="smollm2", help="a conf/target name")
    ap.add_argument("--tokens", type=int, default=512, help="tokens of the text")
    args = ap.parse_args(argv)
    target, tok = load_target(compose([f"target={args.target}"])[0].target)
    text = inspect.getsource(inspect)[20000:40000]
    ids = tok(text, return_tensors="pt").input_ids[:, : args.tokens]
    T = ids.shape[1]
    anchors = torch.arange(T // 5, T - 16, max(1, (T - 16 - T // 5) // 16))[None]
    print("| drafter | anchor row | context a-1 | all context | mask rows | entropy (nats) |")
    print("|---|---|---|---|---|---|")
    for path in args.drafters:
        d = Drafter.from_pretrained(path, target=target, tokenizer=tok).eval()
        if not isinstance(d, DFlashDrafter):
            raise UserError(f"{path} holds a {d.kind} drafter; block_attention reads DFlash drafters")
        feats, _ = target_features(target, ids, torch.ones_like(ids), d.feature_layers())
        s = shares(position1_attention(d, feats, ids, anchors), anchors, T, d.block_size)
        cells = [f"{100 * s[k]:.1f}%" for k in ("anchor row", "context a-1", "all context", "mask rows")]
        print(f"| {path} | " + " | ".join(cells) + f" | {s['entropy']:.2f} |", flush=True)


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
