"""One shard's rows through the frozen target: features, and the labels training reads, flattened.

Rows of similar length are batched together (sorted, packed up to ``batch_tokens`` padded
tokens per forward) so little of each forward is padding; the results go back in row order,
flattened into the shard columns :mod:`draftheads.data.cache.manifest` describes. The target's
vocabulary projection runs only where something is stored from it (:func:`labelled`), so the
prompt positions of a row cost no projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from draftheads.data.cache.manifest import STORE_DTYPES
from draftheads.heads.features import target_features

if TYPE_CHECKING:
    from tqdm.auto import tqdm


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Row indices grouped by similar length, each group at most ``batch_tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, cur = [], []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * width > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def labelled(loss_mask: list[int]) -> list[bool]:
    """The positions whose next token is a loss token (``loss_mask[p + 1]``): where training
    reads the target's top-k as the label of the next token."""
    return [bool(m) for m in loss_mask[1:]] + [False]


@torch.no_grad()
def encode_shard(
    model: nn.Module,
    rows: list[list[int]],
    masks: list[list[int]],
    layers: list[int],
    dtype: str,
    batch_tokens: int,
    pad_id: int,
    topk: int,
    target_next: bool,
    progress: tqdm,
) -> dict[str, torch.Tensor]:
    """Run the target over one shard's rows (length-bucketed batches) and flatten the results.

    The target's top-k is projected and stored only where training reads it (:func:`labelled`);
    every other position holds zeros, as padding does. ``target_next`` is stored everywhere, so
    with it the whole sequence is projected.
    """
    device = model.get_input_embeddings().weight.device  # a sharded target's: where its embedding is
    lengths = [len(r) for r in rows]
    feats: list[torch.Tensor | None] = [None] * len(rows)
    nexts: list[torch.Tensor | None] = [None] * len(rows)
    tk_ids: list[torch.Tensor | None] = [None] * len(rows)
    tk_val: list[torch.Tensor | None] = [None] * len(rows)
    for batch in length_batches(lengths, batch_tokens):
        width = max(lengths[i] for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        at = torch.zeros((len(batch), width), dtype=torch.bool)
        for j, i in enumerate(batch):
            ids[j, : lengths[i]] = torch.tensor(rows[i])
            attn[j, : lengths[i]] = 1
            at[j, : lengths[i]] = True if target_next else torch.tensor(labelled(masks[i]))
        at = at if target_next or topk else None
        f, logits = target_features(
            model, ids.to(device), attn.to(device), layers, logits_at=None if at is None else at.to(device)
        )
        f = f.to("cpu", STORE_DTYPES[dtype])
        if at is not None:
            lg = logits.float()
            nxt = lg.argmax(-1).to("cpu", torch.int32) if target_next else None
            v, k = lg.topk(topk, dim=-1) if topk else (None, None)
            ends = at.sum(1).cumsum(0).tolist()  # row j's positions are [ends[j-1], ends[j]) of lg
        for j, i in enumerate(batch):
            n = lengths[i]
            feats[i] = f[j, :n].clone()
            if at is None:
                continue
            lo, hi = (ends[j - 1] if j else 0), ends[j]
            if target_next:
                nexts[i] = nxt[lo:hi]
            if topk:
                sel = at[j, :n]
                tk_ids[i] = torch.zeros(n, topk, dtype=torch.int32)
                tk_val[i] = torch.zeros(n, topk, dtype=torch.float32)
                tk_ids[i][sel], tk_val[i][sel] = k[lo:hi].to("cpu", torch.int32), v[lo:hi].cpu()
        progress.update(sum(lengths[i] for i in batch))
    out = {
        "offsets": torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0),
        "input_ids": torch.tensor([t for r in rows for t in r], dtype=torch.int32),
        "features": torch.cat(feats).contiguous(),
    }
    if target_next:
        out["target_next"] = torch.cat(nexts)
    if topk:
        out["topk_ids"], out["topk_logits"] = torch.cat(tk_ids), torch.cat(tk_val)
    return out
