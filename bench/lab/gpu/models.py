"""The random models the check runs, built directly on the device, and the targets' own outputs.

Targets are random-initialised Llama models of a set shape (about 1B and 8B, or tiny ones for
the CPU check); nothing is downloaded. :func:`steer` fixes a target's greedy text so that bf16
rounding cannot flip a token; :func:`references` is the greedy ``generate`` every decoding run
is held to. The drafters (EAGLE-3, DFlash) are random too: the check times them and proves
output identity, neither of which needs trained weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from draftheads.heads import DFlashDrafter, EagleDrafter

# name: (hidden, layers, heads, kv heads, intermediate, vocab)
SHAPES = {
    "llama-1b": (2048, 16, 32, 8, 8192, 128256),
    "llama-8b": (4096, 32, 32, 8, 14336, 128256),
}
SMALL_SHAPES = {
    "small-a": (64, 4, 4, 2, 128, 512),
    "small-b": (96, 5, 4, 2, 192, 512),
}


@contextmanager
def building(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Create modules directly on ``device`` in ``dtype`` (no float32 copy on the host)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def build_target(
    shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, seed: int = 0
) -> PreTrainedModel:
    """A random-initialised LlamaForCausalLM of ``shape`` on ``device`` (SDPA attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv_heads, inter, vocab = shape
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with building(device, dtype):
        model = LlamaForCausalLM(config)
    model.eval().requires_grad_(False)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@torch.no_grad()
def steer(target: PreTrainedModel) -> None:
    """Make the target's greedy text a fixed successor map (token t -> t + 1) with a wide margin:
    the embeddings dominate the residual stream and lm_head row t + 1 reads embedding t. Every
    layer still runs, so speed is unchanged, but bf16 rounding can no longer flip a token."""
    emb = target.get_input_embeddings().weight
    emb.mul_(50.0)
    unit = emb / emb.norm(dim=-1, keepdim=True)
    target.lm_head.weight.copy_(unit.roll(1, dims=0) * target.lm_head.weight.norm(dim=-1, keepdim=True))


def build_dflash(target: PreTrainedModel, small: bool, layers: int = 5) -> DFlashDrafter:
    """A random DFlash drafter for ``target`` (block 16, ``layers`` layers as the 8B recipes have,
    draft vocabulary of the first ids), on its device."""
    from draftheads.heads import DFlashDrafter, fingerprint

    p = next(target.parameters())
    torch.manual_seed(2)
    V = target.config.vocab_size
    with building(p.device, p.dtype):
        drafter = DFlashDrafter(
            fingerprint(target),
            target.config.to_dict(),
            mask_token_id=V - 1,
            num_decoder_layers=layers,
            draft_vocab_size=256 if small else 32000,
        )
    return drafter.attach(target).eval().requires_grad_(False)


def build_eagle(target: PreTrainedModel, small: bool) -> EagleDrafter:
    """A random EAGLE-3 drafter for ``target`` (draft vocabulary of the first ids), on its device."""
    from draftheads.heads import EagleDrafter, fingerprint

    p = next(target.parameters())
    torch.manual_seed(1)
    with building(p.device, p.dtype):
        vocab = 256 if small else 32000
        eagle = EagleDrafter(
            fingerprint(target), target_config=target.config.to_dict(), version=3, draft_vocab_size=vocab
        )
    eagle.attach(target).init_lm_head_from_target()
    return eagle.eval().requires_grad_(False)


def random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> torch.Tensor:
    """``[n, length]`` random prompts; every other one repeats its first half (lookup finds matches)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    ids[1::2, length // 2 :] = ids[1::2, : length - length // 2]
    return ids


@torch.no_grad()
def references(
    target: PreTrainedModel, prompts: torch.Tensor, new: int, logits: bool = False
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Each prompt's greedy continuation by ``target.generate`` (and its per-token logits)."""
    dev = next(target.parameters()).device
    refs, scores = [], []
    for ids in prompts:
        ids = ids[None].to(dev)
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            do_sample=False,
            output_logits=logits,
            return_dict_in_generate=True,
        )
        refs.append(out.sequences[0, ids.shape[1] :].tolist())
        if logits:
            scores.append(torch.stack(out.logits, 1)[0].float().cpu())
    return refs, scores
