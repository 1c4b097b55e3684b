"""The speculative decoding loop: draft a tree, verify it in one target forward, keep the accepted path.

One step, for every active row of the batch at once::

    tree  = proposer.propose(root, pos)                 # Medusa heads or the EAGLE drafter
    out   = target(tree.tokens, 4-D tree mask, position_ids = pos + depth, cache)
    best, bonus = accept(out.logits, tree)              # greedy / rejection sampling / typical
    compact the target's KV: keep root + accepted path, drop the rest
    emit path tokens + bonus; the bonus is the next root

The target is a stock transformers model: the tree goes in as an additive 4-D attention mask
``[B, 1, T, S + T]`` (cache columns: the row's valid slots; tree columns: the ancestor mask)
with explicit ``position_ids``; transformers uses a 4-D mask as given. Nothing is forked.

Batches: rows accept different lengths. Row b owns cache slots ``[0, length[b])``; the
cache's physical length is the longest row's, and shorter rows' tails are masked (see kv.py).
Finished rows leave the batch. Left-padded prompts are masked the same way, and positions
count only real tokens, so a row's output is the one it gets decoded alone.

Counting: the prefill forward yields the first new token and is not a decoding step. Each
later target forward is one step; it yields (accepted drafts + 1 bonus) tokens, and
``tau`` is the mean of that over steps (tokens cut by EOS, a stop string or
``max_new_tokens`` are not counted).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import dynamic, kv
from draftheads.decode.tree import (
    TREE_FILE,
    StaticTree,
    ancestor_mask,
    best_tree,
    chain,
    load_tree_file,
    parse_tree,
    path_nodes,
    prior_accuracies,
    tree_from_choices,
)
from draftheads.decode.verify import greedy_accept, sample_accept, typical_accept, warp
from draftheads.heads.masks import additive_mask, padded_causal

MASKABLE_ATTENTION = ("sdpa", "eager")


@dataclass
class DecodeStats:
    """Counters of one ``generate``/``stream`` call (all rows together)."""

    target_forwards: int = 0  # prefill included
    new_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)  # per row and step: drafts + bonus
    accepted_depths: list[int] = field(default_factory=list)  # per row and step: drafts accepted
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    total_time_s: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens per decoding step (target forward), bonus token included."""
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def per_position_acceptance(self) -> list[float]:
        """Fraction of steps whose draft at depth d (1-based, index d-1) was accepted."""
        steps = max(len(self.accepted_depths), 1)
        top = max(self.accepted_depths, default=0)
        return [sum(a >= d for a in self.accepted_depths) / steps for d in range(1, top + 1)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0


@dataclass
class Tree:
    """One step's tree for every active row: ``[B, T]`` tokens/parents/depths, ``anc [B, T, T]``."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    anc: torch.Tensor
    max_depth: int


def tree_mask(cache_valid: torch.Tensor, anc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Mask of T new tokens: each sees its row's valid cache slots and its tree ancestors."""
    B, T, _ = anc.shape
    return additive_mask(torch.cat([cache_valid[:, None, :].expand(B, T, -1), anc], dim=-1), dtype)


def append_valid(
    valid: torch.Tensor, lengths: torch.Tensor, new: torch.Tensor, new_length: int
) -> torch.Tensor:
    """Slot validity after writing ``new [B, n]`` at each row's ``lengths[b]``: ``[B, new_length]``."""
    B, S = valid.shape
    slot = torch.arange(new_length, device=valid.device)[None]
    old = torch.nn.functional.pad(valid, (0, max(new_length - S, 0)))[:, :new_length] & (
        slot < lengths[:, None]
    )
    rel = slot - lengths[:, None]
    inside = (rel >= 0) & (rel < new.shape[1])
    return old | (inside & new.gather(1, rel.clamp(0, new.shape[1] - 1)))


class _Proposer:
    """Drafts a tree per step. ``prefill``/``update`` feed it the target's hidden states."""

    def prefill(self, hidden_states, input_ids, valid, positions, root) -> None:
        raise NotImplementedError

    def propose(self, root: torch.Tensor, pos: torch.Tensor) -> Tree:
        raise NotImplementedError

    def update(self, hidden_states, path, tokens, n_keep, n_cpu, pos) -> None:
        raise NotImplementedError

    def select_rows(self, rows: torch.Tensor) -> None:
        raise NotImplementedError


def _static_tree(
    static: StaticTree, root: torch.Tensor, tokens_by_node: torch.Tensor, anc: torch.Tensor
) -> Tree:
    B = root.shape[0]
    tokens = torch.cat([root[:, None], tokens_by_node[:, 1:]], 1)
    return Tree(
        tokens, static.parents.expand(B, -1), static.depths.expand(B, -1), anc.expand(B, -1, -1), static.depth
    )


def _levels(static: StaticTree, anc: torch.Tensor) -> list[tuple]:
    """Per depth d: (nodes, their parents, each node's slot among the parents, ranks, nodes with
    children to feed, the fed nodes' ancestor mask over all nodes fed up to then)."""
    parents, depths, ranks = static.parents.tolist(), static.depths.tolist(), static.ranks.tolist()
    has_kids, fed, out = set(parents[1:]), [], []
    for d in range(1, static.depth + 1):
        nodes = [i for i in range(1, static.size) if depths[i] == d]
        par = sorted({parents[i] for i in nodes})
        feed = [i for i in nodes if i in has_kids]
        fed += feed
        idx = torch.tensor(fed, dtype=torch.long, device=anc.device)
        anc_fed = anc[idx][:, idx][len(fed) - len(feed) :]
        out.append(
            (nodes, par, [par.index(parents[i]) for i in nodes], [ranks[i] for i in nodes], feed, anc_fed)
        )
    return out


class MedusaProposer(_Proposer):
    """Medusa: head k's top-k at the last accepted position fill depth k+1 of a static tree.

    Only the heads the tree reaches are evaluated, on one position per row, and only the
    candidates the tree uses (top max-rank+1) are kept.
    """

    def __init__(self, drafter, static: StaticTree) -> None:
        self.drafter, self.static = drafter, static
        self.layer = drafter.feature_layers()[0]
        self.anc = ancestor_mask(static.parents, static.depth)
        self.topk = static.topk_per_depth()
        self.levels = _levels(static, self.anc)
        self.hidden: torch.Tensor | None = None

    def prefill(self, hidden_states, input_ids, valid, positions, root) -> None:
        self.hidden = hidden_states[self.layer][:, -1]

    def propose(self, root: torch.Tensor, pos: torch.Tensor) -> Tree:
        depth = len(self.topk)
        logits = self.drafter.heads_logits(self.drafter.head_hidden(self.hidden, depth))  # [D, B, V]
        B, T = root.shape[0], self.static.size
        cands = [logits[d].topk(k, dim=-1).indices for d, k in enumerate(self.topk)]
        tokens = torch.zeros(B, T, dtype=torch.long, device=root.device)
        for c, (nodes, _, _, ranks, _, _) in zip(cands, self.levels):
            tokens[:, nodes] = c[:, ranks]
        return _static_tree(self.static, root, tokens, self.anc)

    def update(self, hidden_states, path, tokens, n_keep, n_cpu, pos) -> None:
        rows = torch.arange(path.shape[0], device=path.device)
        self.hidden = hidden_states[self.layer][rows, path.gather(1, (n_keep - 1)[:, None])[:, 0]]

    def select_rows(self, rows: torch.Tensor) -> None:
        self.hidden = self.hidden.index_select(0, rows)


class EagleProposer(_Proposer):
    """EAGLE: the drafter runs autoregressively over the tree with its own KV cache.

    The drafter reads pairs (target feature f_t, next token x_{t+1}) at position t. After the
    prefill it reads the prompt's features with the tokens shifted by one (the last token being
    the root); after each step, the accepted path's features with the tokens that followed
    them (the accepted drafts and the bonus). Tree entries are dropped from its cache at the
    next step; the accepted pairs stay, compacted per row like the target's.
    """

    def __init__(self, drafter, static: StaticTree | None, cfg: DecodeConfig) -> None:
        from transformers import DynamicCache

        self.drafter, self.static, self.cfg = drafter, static, cfg
        self.cache = DynamicCache()
        self.valid: torch.Tensor | None = None  # [B, S] stable slots that hold a real pair
        self.lengths: torch.Tensor | None = None
        self.lengths_cpu: list[int] = []
        self.pending: tuple | None = None
        if static is not None:
            self.anc = ancestor_mask(static.parents, static.depth)
            self.topk = static.topk_per_depth()
            self.parents, self.levels = static.parents.tolist(), _levels(static, self.anc)

    # -- feeding the accepted pairs ---------------------------------------------------------
    def prefill(self, hidden_states, input_ids, valid, positions, root) -> None:
        feats = self.drafter.select_features(hidden_states)
        tokens = torch.cat([input_ids[:, 1:], root[:, None]], 1)
        B, P = tokens.shape
        self.valid = torch.zeros(B, 0, dtype=torch.bool, device=tokens.device)
        self.lengths = torch.zeros(B, dtype=torch.long, device=tokens.device)
        self.lengths_cpu = [0] * B
        self.pending = (feats, tokens, valid, positions, torch.full_like(self.lengths, P), [P] * B)

    def update(self, hidden_states, path, tokens, n_keep, n_cpu, pos) -> None:
        rows = torch.arange(path.shape[0], device=path.device)[:, None]
        feats = self.drafter.select_features(hidden_states)[rows, path]
        A = path.shape[1]
        j = torch.arange(A, device=path.device)[None]
        self.pending = (feats, tokens, j < n_keep[:, None], pos[:, None] + j, n_keep, n_cpu)

    def _feed_pending(self) -> torch.Tensor:
        """Run the drafter on the pending pairs; keep them in its cache; return the root's output."""
        feats, tokens, valid, positions, n_keep, n_cpu = self.pending
        S = kv.seq_length(self.cache)
        n = tokens.shape[1]
        allowed = padded_causal(valid)
        mask = additive_mask(torch.cat([self.valid[:, None, :].expand(-1, n, -1), allowed], -1), feats.dtype)
        out = self.drafter(tokens, self.drafter.fuse(feats), positions, mask, self.cache)
        new_len = max(a + b for a, b in zip(self.lengths_cpu, n_cpu))
        src = S + torch.arange(n, device=tokens.device).expand(len(n_cpu), n)
        kv.compact(self.cache, src, self.lengths[:, None] + src - S, new_len)
        self.valid = append_valid(self.valid, self.lengths, valid, new_len)
        self.lengths = self.lengths + n_keep
        self.lengths_cpu = [a + b for a, b in zip(self.lengths_cpu, n_cpu)]
        rows = torch.arange(out.shape[0], device=out.device)
        return out[rows, n_keep - 1]

    def _feed_tree(self, tokens, hidden, positions, anc_fed) -> torch.Tensor:
        """Run the drafter on new tree nodes; ``anc_fed [B, n, F]`` = their ancestors among the
        tree nodes fed so far, themselves last. Their KV stays until the next step truncates it."""
        n = tokens.shape[1]
        mask = additive_mask(torch.cat([self.valid[:, None, :].expand(-1, n, -1), anc_fed], -1), hidden.dtype)
        return self.drafter(tokens, hidden, positions, mask, self.cache)

    def _log_q(self, out: torch.Tensor) -> torch.Tensor:
        return self.drafter.logits(out).float().log_softmax(-1)

    # -- drafting ---------------------------------------------------------------------------
    def propose(self, root: torch.Tensor, pos: torch.Tensor) -> Tree:
        kv.truncate(self.cache, self.valid.shape[1])
        h_root = self._feed_pending()
        if self.static is not None:
            return self._propose_static(root, pos, h_root)
        return self._propose_dynamic(root, pos, h_root)

    def _propose_dynamic(self, root: torch.Tensor, pos: torch.Tensor, h_root: torch.Tensor) -> Tree:
        """EAGLE-2: expand the top_k most confident nodes ``depth - 1`` times, rerank to total_tokens."""
        k, depth, n = self.cfg.top_k_draft, self.cfg.depth, self.cfg.total_tokens - 1
        B, dev = root.shape[0], root.device
        top = self._log_q(h_root).topk(k, dim=-1)
        scores, ids = [top.values], [top.indices]
        parents = [torch.full((B, k), -1, dtype=torch.long, device=dev)]
        depths = [torch.ones(B, k, dtype=torch.long, device=dev)]
        front = torch.arange(k, device=dev).expand(B, k)  # candidate ids of the frontier
        front_hidden = h_root[:, None].expand(B, k, -1)
        front_anc = torch.zeros(B, k, 0, dtype=torch.bool, device=dev)  # their fed ancestors
        eye = torch.eye(k, dtype=torch.bool, device=dev).expand(B, k, k)
        offset = k
        for d in range(1, depth):
            all_scores, all_ids = torch.cat(scores, 1), torch.cat(ids, 1)
            front_ids = self.drafter.draft_to_target(all_ids.gather(1, front))
            new_anc = torch.cat([front_anc, eye], -1)  # [B, k, fed so far]: ancestors and self
            out = self._feed_tree(front_ids, front_hidden, (pos + d - 1)[:, None].expand(B, k), new_anc)
            c_scores, c_ids, slot = dynamic.children(self._log_q(out), all_scores.gather(1, front), k)
            scores.append(c_scores)
            ids.append(c_ids)
            parents.append(front.gather(1, slot))
            depths.append(torch.full_like(c_ids, d + 1))
            pick = dynamic.frontier(c_scores, k)
            pslot = slot.gather(1, pick)
            front = offset + pick
            offset += c_scores.shape[1]
            front_hidden = out.gather(1, pslot[..., None].expand(-1, -1, out.shape[-1]))
            front_anc = new_anc.gather(1, pslot[..., None].expand(-1, -1, new_anc.shape[-1]))
        all_ids = self.drafter.draft_to_target(torch.cat(ids, 1))
        tokens, tparents, tdepths = dynamic.rerank(
            root, torch.cat(scores, 1), all_ids, torch.cat(parents, 1), torch.cat(depths, 1), n
        )
        max_depth = depth
        return Tree(tokens, tparents, tdepths, ancestor_mask(tparents, max_depth), max_depth)

    def _propose_static(self, root: torch.Tensor, pos: torch.Tensor, h_root: torch.Tensor) -> Tree:
        """A static tree: level by level, take each parent's top-k, feed the nodes that have children."""
        st, lv = self.static, self.levels
        B, dev = root.shape[0], root.device
        tokens = torch.zeros(B, st.size, dtype=torch.long, device=dev)
        outs = torch.zeros(B, st.size, h_root.shape[-1], dtype=h_root.dtype, device=dev)
        outs[:, 0] = h_root
        for d, (nodes, par, par_slot, ranks, feed, anc_fed) in enumerate(lv, start=1):
            top = self._log_q(outs[:, par]).topk(self.topk[d - 1], dim=-1).indices  # [B, parents, k]
            tokens[:, nodes] = self.drafter.draft_to_target(top[:, par_slot, ranks])
            if feed:
                hidden = outs[:, [self.parents[i] for i in feed]]
                positions = (pos + d - 1)[:, None].expand(B, len(feed))
                outs[:, feed] = self._feed_tree(tokens[:, feed], hidden, positions, anc_fed.expand(B, -1, -1))
        return _static_tree(st, root, tokens, self.anc)

    def select_rows(self, rows: torch.Tensor) -> None:
        kv.select_rows(self.cache, rows)
        self.valid = self.valid.index_select(0, rows)
        self.lengths = self.lengths.index_select(0, rows)
        keep = rows.tolist()
        self.lengths_cpu = [self.lengths_cpu[i] for i in keep]
        feats, tokens, valid, positions, n_keep, n_cpu = self.pending
        self.pending = (
            feats.index_select(0, rows),
            tokens.index_select(0, rows),
            valid.index_select(0, rows),
            positions.index_select(0, rows),
            n_keep.index_select(0, rows),
            [n_cpu[i] for i in keep],
        )


class _Stopper:
    """Ends a row at the right token: EOS, a stop string, or ``max_new_tokens``."""

    def __init__(self, eos: set[int], stop_strings: list[str] | None, tokenizer, max_new_tokens: int) -> None:
        if stop_strings and tokenizer is None:
            raise UserError("stop_strings need a tokenizer; pass tokenizer= to SpeculativeGenerator")
        self.eos, self.stops, self.tok, self.max_new = (
            eos,
            list(stop_strings or []),
            tokenizer,
            max_new_tokens,
        )
        self.window = max((len(s) for s in self.stops), default=0) + 8  # tokens: >= 1 char each, mostly

    def cut(self, generated: list[int], new: list[int]) -> tuple[list[int], bool]:
        """The prefix of ``new`` to keep after ``generated``, and whether the row is finished."""
        for i, t in enumerate(new):
            if (
                len(generated) + i + 1 >= self.max_new
                or t in self.eos
                or self._stopped(generated + new[: i + 1])
            ):
                return new[: i + 1], True
        return new, False

    def _stopped(self, ids: list[int]) -> bool:
        if not self.stops:
            return False
        tail = self.tok.decode(ids[-self.window :])
        before = self.tok.decode(ids[-self.window : -1])
        # stop at the first token after which the text holds a stop string it did not hold before
        return any(s in tail and s not in before for s in self.stops)


def _as_set(eos) -> set[int]:
    if eos is None:
        return set()
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


class SpeculativeGenerator:
    """Speculative decoding of a frozen Hugging Face causal LM with a draftheads drafter.

    ``generate`` returns what ``target.generate`` returns (prompt + new tokens, right-padded with
    the pad id per row); greedy output is the target's own greedy output, sampling follows the
    target's (temperature, top-k, top-p warped) distribution exactly, except with
    ``config.typical=True`` (Medusa's typical acceptance, faster, not lossless).

    The drafter is moved to the target's device and dtype. Its tree is ``config.tree``:
    ``auto`` (``tree.json`` beside the heads when the drafter was loaded from a directory that
    has one, else a default; EAGLE with ``config.dynamic`` builds EAGLE-2 dynamic trees),
    ``chain``/``chainN``, a JSON choices list, or a path to a tree.json.
    """

    def __init__(
        self,
        target: nn.Module,
        drafter: nn.Module,
        tokenizer=None,
        config: DecodeConfig | None = None,
        tree_dir: str | None = None,
    ) -> None:
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.config = config or DecodeConfig()
        impl = getattr(target.config, "_attn_implementation", None) or "eager"
        if impl not in MASKABLE_ATTENTION:
            raise UserError(
                f"the target's attention implementation {impl!r} cannot take a tree attention mask; "
                f"load it with attn_implementation='sdpa' (or 'eager')"
            )
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        drafter.to(device=self.device, dtype=self.dtype)
        drafter.eval()
        self.static = self._resolve_tree(tree_dir)
        self.last_stats = DecodeStats()

    # -- configuration ----------------------------------------------------------------------
    def _resolve_tree(self, tree_dir: str | None) -> StaticTree | None:
        cfg, kind = self.config, getattr(self.drafter, "kind", "")
        if kind not in ("medusa", "eagle"):
            raise UserError(
                f"drafter kind {kind!r} is not supported; use a draftheads MedusaHeads or EagleDrafter"
            )
        num_heads = getattr(self.drafter, "num_heads", None) if kind == "medusa" else None
        choices = parse_tree(cfg.tree, num_heads)
        directory = tree_dir or getattr(self.drafter, "source_dir", None)
        if choices is None and directory is not None:
            from pathlib import Path

            f = Path(directory) / TREE_FILE
            choices = load_tree_file(f) if f.is_file() else None
        if choices is None and kind == "eagle" and cfg.dynamic:
            if cfg.top_k_draft < 1 or cfg.depth < 1 or cfg.total_tokens < 2:
                raise UserError(
                    f"decode.top_k_draft={cfg.top_k_draft}, depth={cfg.depth}, total_tokens={cfg.total_tokens}: "
                    "need top_k_draft >= 1, depth >= 1 and total_tokens >= 2"
                )
            return None
        if choices is None:
            if kind == "medusa":
                choices = best_tree(prior_accuracies(num_heads), max(cfg.total_tokens - 1, 1))
            else:
                choices = chain(cfg.depth)
        return tree_from_choices(choices, num_heads).to(self.device)

    def _proposer(self) -> _Proposer:
        if self.drafter.kind == "medusa":
            return MedusaProposer(self.drafter, self.static)
        return EagleProposer(self.drafter, self.static, self.config)

    # -- public API -------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        """Decode like ``target.generate``: returns ``[B, P + new]`` (prompt, then new tokens
        right-padded with the pad id). Keyword arguments as :meth:`stream`."""
        B, P = input_ids.shape
        rows: list[list[int]] = [[] for _ in range(B)]
        for step in self.stream(input_ids, attention_mask, **kwargs):
            for b, toks in enumerate(step):
                rows[b] += toks
        pad = self._pad_id()
        out = torch.full((B, P + max(map(len, rows), default=0)), pad, dtype=torch.long)
        out[:, :P] = input_ids.cpu()
        for b, r in enumerate(rows):
            out[b, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
        return out.to(input_ids.device)

    def _pad_id(self) -> int:
        gc = getattr(self.target, "generation_config", None)
        for cand in (
            getattr(gc, "pad_token_id", None),
            getattr(self.tokenizer, "pad_token_id", None),
            getattr(gc, "eos_token_id", None),
        ):
            if cand is not None:
                return int(cand[0] if isinstance(cand, (list, tuple)) else cand)
        return 0

    @torch.no_grad()
    def stream(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: list[str] | None = None,
        typical: bool | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[list[list[int]]]:
        """Yield, per target forward, the new tokens of every input row (``[]`` for finished rows).

        Unset arguments default to the :class:`DecodeConfig`. ``eos_token_id`` defaults to the
        target's generation config. Stats of the call land in ``self.last_stats``.
        """
        cfg = self.config
        max_new = cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
        sample = cfg.do_sample if do_sample is None else do_sample
        temp = cfg.temperature if temperature is None else temperature
        tp = cfg.top_p if top_p is None else top_p
        tk = cfg.top_k if top_k is None else top_k
        typ = (cfg.typical if typical is None else typical) and sample
        if eos_token_id is None:
            eos_token_id = getattr(getattr(self.target, "generation_config", None), "eos_token_id", None)
        stopper = _Stopper(
            _as_set(eos_token_id),
            stop_strings if stop_strings is not None else cfg.stop,
            self.tokenizer,
            max_new,
        )
        if max_new < 1:
            raise UserError(f"max_new_tokens={max_new}: must be at least 1")
        if sample and temp <= 0:
            raise UserError(f"temperature={temp}: must be > 0 when sampling (use do_sample=False for greedy)")
        self._check_length(input_ids.shape[1] + max_new)

        stats = self.last_stats = DecodeStats()
        t_start = time.perf_counter()
        B = input_ids.shape[0]
        dev = self.device
        ids = input_ids.to(dev)
        valid = (attention_mask.to(dev) if attention_mask is not None else torch.ones_like(ids)).bool()
        positions = (valid.long().cumsum(-1) - 1).clamp_min(0)

        from transformers import DynamicCache

        cache = DynamicCache()
        P = ids.shape[1]
        allowed = padded_causal(valid)
        out = self.target(
            input_ids=ids,
            attention_mask=additive_mask(allowed, self.dtype),
            position_ids=positions,
            cache=cache,
            use_cache=True,
            output_hidden_states=True,
            logits_to_keep=1,
        )
        stats.target_forwards += 1
        last = out.logits[:, -1]
        root = (
            torch.multinomial(warp(last, temp, tk, tp), 1, generator=generator)[:, 0]
            if sample
            else last.argmax(-1)
        )
        proposer = self._proposer()
        proposer.prefill(out.hidden_states, ids, valid, positions, root)
        del out
        pos = positions[:, -1] + 1  # the root's position
        kv_valid, lengths, lengths_cpu = valid, torch.full((B,), P, device=dev), [P] * B
        generated: list[list[int]] = [[] for _ in range(B)]
        active = list(range(B))
        first = root.tolist()
        step_out: list[list[int]] = [[] for _ in range(B)]
        finished = []
        for b, t in enumerate(first):
            kept, done = stopper.cut(generated[b], [t])
            generated[b] += kept
            step_out[b] = kept
            if done:
                finished.append(b)
        stats.new_tokens += B
        stats.prefill_time_s = time.perf_counter() - t_start
        yield step_out

        while True:
            if finished:
                keep = [i for i, b in enumerate(active) if b not in finished]
                active = [active[i] for i in keep]
                if not active:
                    break
                rows = torch.tensor(keep, dtype=torch.long, device=dev)
                kv.select_rows(cache, rows)
                proposer.select_rows(rows)
                kv_valid, lengths, pos, root = (
                    t.index_select(0, rows) for t in (kv_valid, lengths, pos, root)
                )
                lengths_cpu = [lengths_cpu[i] for i in keep]
            t0 = self._now()
            tree = proposer.propose(root, pos)
            t1 = self._now()
            stats.draft_time_s += t1 - t0

            S = kv_valid.shape[1]
            out = self.target(
                input_ids=tree.tokens,
                attention_mask=tree_mask(kv_valid, tree.anc, self.dtype),
                position_ids=pos[:, None] + tree.depths,
                cache=cache,
                use_cache=True,
                output_hidden_states=True,
            )
            stats.target_forwards += 1
            if not sample:
                best, bonus = greedy_accept(out.logits, tree.tokens, tree.parents, tree.depths, tree.anc)
            elif typ:
                best, bonus = typical_accept(
                    out.logits,
                    tree.tokens,
                    tree.parents,
                    tree.depths,
                    tree.anc,
                    temp,
                    tk,
                    tp,
                    cfg.typical_epsilon,
                    cfg.typical_delta,
                )
            else:
                best, bonus = sample_accept(
                    out.logits, tree.tokens, tree.parents, tree.depths, temp, tk, tp, generator
                )
            A = tree.max_depth + 1
            path = path_nodes(tree.anc, best, A)  # [b, A]: root, accepted drafts, then padding
            n_keep = tree.depths.gather(1, best[:, None])[:, 0] + 1  # KV entries kept = tokens emitted
            emitted = tree.tokens.gather(1, path).roll(-1, dims=1)
            emitted.scatter_(1, (n_keep - 1)[:, None], bonus[:, None])
            host = torch.cat([n_keep[:, None], emitted], 1).tolist()  # the one sync of the step
            n_cpu = [h[0] for h in host]
            new_len = max(a + n for a, n in zip(lengths_cpu, n_cpu))
            j = torch.arange(A, device=dev)[None]
            kv.compact(cache, S + path, lengths[:, None] + j, new_len)
            kv_valid = append_valid(kv_valid, lengths, j < n_keep[:, None], new_len)
            lengths = lengths + n_keep
            lengths_cpu = [a + n for a, n in zip(lengths_cpu, n_cpu)]
            proposer.update(out.hidden_states, path, emitted, n_keep, n_cpu, pos)
            del out
            pos = pos + n_keep
            root = bonus
            stats.verify_time_s += self._now() - t1

            step_out = [[] for _ in range(B)]
            finished = []
            for i, b in enumerate(active):
                n = n_cpu[i]
                kept, done = stopper.cut(generated[b], host[i][1 : 1 + n])
                generated[b] += kept
                step_out[b] = kept
                stats.new_tokens += len(kept)
                stats.accepted_lengths.append(len(kept))
                stats.accepted_depths.append(n - 1)
                if done:
                    finished.append(b)
            stats.total_time_s = time.perf_counter() - t_start
            yield step_out
        stats.total_time_s = time.perf_counter() - t_start

    # -- helpers ----------------------------------------------------------------------------
    def _now(self) -> float:
        """Wall time after the device has finished its queued work (CUDA runs asynchronously)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _check_length(self, total: int) -> None:
        c = self.target.config
        window = getattr(c, "sliding_window", None)
        if window and getattr(c, "use_sliding_window", True) and total > window:
            raise UserError(
                f"prompt + max_new_tokens = {total} exceeds the target's sliding window {window}; "
                "tree decoding masks full attention only, so shorten the request"
            )
