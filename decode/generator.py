"""The speculative decoding loop: prefill, then steps, retiring rows as they finish.

One step, for every active row of the batch at once::

    tree  = proposer.propose(root, pos, plan)           # Medusa, EAGLE, lookup, or a mix
    tree  = prune(tree, n*)                             # only the nodes that pay (cost.py);
                                                        # not cost-aware: drop_padding(tree)
    out   = target(tree.tokens, 4-D tree mask, position_ids = pos + depth, cache)
    best, bonus = accept(out.logits, tree)              # greedy / rejection sampling / typical
    compact the target's KV: keep root + accepted path, drop the rest
    emit path tokens + bonus; the bonus is the next root

The target is a stock transformers model: the tree goes in as an additive 4-D attention mask
``[B, 1, T, S + T]`` (cache columns: the row's valid slots; tree columns: the ancestor mask)
with explicit ``position_ids``; transformers uses a 4-D mask as given. Nothing is forked. The
target and the drafter run on ``decode.backend`` (backend.py) while a call is in progress.

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
from transformers import GenerationConfig

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import backend as backends
from draftheads.decode import backend_choice, kv, static
from draftheads.decode.context import cap_depth, check_request, depth_caps, position_limit
from draftheads.decode.cost import CostCurve, Planner, cached_curve, context_bucket
from draftheads.decode.kv import tree_mask
from draftheads.decode.processing import Processing, check_lossless, resolve
from draftheads.decode.proposers import build_proposer
from draftheads.decode.proposers.base import Accepted, Expanded, Plan, Prefill, Proposer, Tree, single_node
from draftheads.decode.select import drop_padding, prune
from draftheads.decode.stats import DecodeStats
from draftheads.decode.stop import Stopper, as_set
from draftheads.decode.tree import (
    drafter_tree,
    path_nodes,
)
from draftheads.decode.verify import draw, greedy_accept, sample_accept, typical_accept
from draftheads.heads.masks import additive_mask, padded_causal

MASKABLE_ATTENTION = ("sdpa", "eager")


@dataclass
class Sampling:
    """How the target's tokens are chosen in one call.

    ``uniforms [B, max_new]`` (sampling only): input row b's n-th new token is drawn with
    ``uniforms[b, n]``, whatever tree verifies it, so a seed fixes the text.
    """

    sample: bool
    typical: bool
    processing: Processing
    uniforms: torch.Tensor | None
    max_new: int


@dataclass
class State:
    """Everything one call carries from step to step, for the rows still active."""

    cache: object
    kv_valid: torch.Tensor  # [b, S] which cache slots hold a real token
    lengths: torch.Tensor  # [b] slots each row owns
    lengths_cpu: list[int]
    pos: torch.Tensor  # [b] the root's position
    root: torch.Tensor  # [b] the last emitted token, not yet in the cache
    active: list[int]  # input row of each active row
    generated: list[list[int]]  # per input row
    prompts: list[list[int]]  # per input row: its real prompt tokens
    finished: list[int] = field(default_factory=list)  # input rows done at the last step
    proposer: Proposer | None = None
    planner: Planner | None = None


class SpeculativeGenerator:
    """Speculative decoding of a frozen Hugging Face causal LM with a draftheads drafter.

    ``generate`` returns what ``target.generate`` returns (prompt + new tokens, right-padded with
    the pad id per row); greedy output is the target's own greedy output, sampling follows the
    target's (temperature, top-k, top-p warped) distribution exactly, except with
    ``config.typical=True`` (Medusa's typical acceptance, faster, not lossless).

    ``drafter`` is a MedusaHeads or EagleDrafter, or None for lookup decoding alone (prompt
    lookup branches, no model). The drafter is moved to the device and dtype of the target's
    lm_head (a sharded target's last device; oneDNN packs none of the layers it offloads). Its
    tree is ``config.tree``: ``auto`` (``tree.json`` beside the heads when the drafter was
    loaded from a directory that has one, else a default; EAGLE with ``config.dynamic`` builds
    EAGLE-2 dynamic trees), ``chain``/``chainN``, a JSON choices list, or a tree.json path.
    """

    def __init__(
        self,
        target: nn.Module,
        drafter: nn.Module | None = None,
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
        # the drafter sits with the lm_head (a sharded target's outputs come back where its inputs are)
        head = target.get_output_embeddings().weight
        self.device, self.dtype = head.device, head.dtype
        self.backend = backends.resolve(self.config.backend, self.device, self.dtype)
        # packed weights kept from call to call (checked unchanged at each); ``packs.clear()`` frees them
        self.packs = backends.PackCache()
        if self.backend == "cuda-graphs" and hasattr(target, "_hf_hook"):
            raise UserError(
                "decode.backend=cuda-graphs cannot capture a target that accelerate spreads or offloads "
                "(target.device_map); use decode.backend=auto"
            )
        if drafter is None and not self.config.lookup:
            raise UserError("nothing to draft with: give a drafter (heads=DIR) or turn on decode.lookup=true")
        if drafter is not None:
            drafter.to(device=self.device, dtype=self.dtype)
            drafter.eval()
        self.choices = self._choose_backends()
        self.static = (
            drafter_tree(drafter, self.config, tree_dir, self.device) if drafter is not None else None
        )
        self.curves: dict[tuple[int, int], CostCurve] = {}  # (batch, context bucket) -> curve
        self.limit = position_limit(target.config)
        self.last_stats = DecodeStats()

    # -- configuration ----------------------------------------------------------------------
    def make_proposer(self) -> Proposer:
        """A fresh proposer for one call: the drafter's (or lookup alone), with lookup branches."""
        return build_proposer(self.drafter, self.static, self.config)

    def cost_curve(self, batch: int = 1, context: int = 1) -> CostCurve:
        """The verify-cost curve of this device, target and backend for ``batch`` rows after
        ``context`` cached tokens (measured once per batch and context bucket, cached)."""
        key = (batch, context_bucket(context))
        if key not in self.curves:
            self.curves[key] = cached_curve(self.target, self.backend, self.config.cost_cache, batch, context)
        return self.curves[key]

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
        pad = self.pad_id()
        out = torch.full((B, P + max(map(len, rows), default=0)), pad, dtype=torch.long)
        out[:, :P] = input_ids.cpu()
        for b, r in enumerate(rows):
            out[b, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
        return out.to(input_ids.device)

    def pad_id(self) -> int:
        """The id ``generate`` pads finished rows with (as the target's ``generate`` does)."""
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
        generation_config: GenerationConfig | None = None,
        **settings,
    ) -> Iterator[list[list[int]]]:
        """Yield, per target forward, the new tokens of every input row (``[]`` for finished rows).

        Settings are resolved as ``target.generate`` resolves them (decode/processing.py): the
        arguments, then any other ``GenerationConfig`` field given as a keyword (e.g.
        ``repetition_penalty=1.3``), over ``generation_config``, over the set values of the
        :class:`DecodeConfig`, over the target's generation config (its eos, sampling defaults,
        penalties). With sampling, ``generator`` (else torch's default CPU generator) draws one
        uniform per output position up front. Stats of the call land in ``self.last_stats``.
        """
        cfg = self.config
        asked = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature)
        asked.update(top_p=top_p, top_k=top_k, eos_token_id=eos_token_id, stop_strings=stop_strings)
        gc = resolve(self.target, cfg, generation_config, {**asked, **settings})
        check_lossless(gc)
        max_new = gc.max_new_tokens
        if max_new < 1:
            raise UserError(f"max_new_tokens={max_new}: must be at least 1")
        stopper = Stopper(as_set(gc.eos_token_id), gc.stop_strings, self.tokenizer, max_new)
        mask = attention_mask.to(self.device).bool() if attention_mask is not None else None
        check_left_padded(mask)
        self._check_length(input_ids.shape[1] + max_new)
        B, P = input_ids.shape
        prompt_lens = mask.sum(-1).tolist() if mask is not None else [P] * B  # real tokens per row
        check_request(self.target.config, max(prompt_lens), max_new)
        sample = bool(gc.do_sample)
        how = Sampling(
            sample,
            (cfg.typical if typical is None else typical) and sample,
            Processing(self.target, gc, prompt_lens, max_new, self.device),
            output_uniforms(B, max_new, generator, self.device) if sample else None,
            max_new,
        )
        planner_curve = self.cost_curve(*input_ids.shape) if cfg.cost_aware else None
        stats = self.last_stats = DecodeStats(backend=self.backend)
        t_start = time.perf_counter()
        stopper.start(input_ids, mask)
        run = self._run_backend()
        with run.active():  # per phase: a stream suspended at a yield leaves the modules stock
            state, first = self.prefill(input_ids.to(self.device), mask, how, stopper, stats)
        if planner_curve is not None:
            state.planner = Planner(planner_curve, len(state.active))
        stats.prefill_time_s = stats.total_time_s = time.perf_counter() - t_start
        yield first
        while self.retire(state):
            with run.active():
                out = self.step(state, how, stopper, stats)
            stats.total_time_s = time.perf_counter() - t_start
            yield out
        stats.total_time_s = time.perf_counter() - t_start

    @torch.no_grad()
    def capture(self, batch: int = 1, context: int = 512) -> float:
        """Capture the CUDA graphs that calls of up to ``batch`` rows and ``context`` tokens each
        (prompt and new tokens) replay on ``decode.backend=cuda-graphs``, before any of them runs
        (or is timed): the verify forward of every bucket, largest first, into the verifier's
        memory pool, and the drafter's fixed-shape drafting call, for ``batch`` rows down to one;
        the buffers are sized for ``context``, so such a call captures nothing. Returns the
        seconds it took.

        Nothing to capture (another backend): a no-op. A verifier or drafting hook made with
        ``capture=False`` (the tests' CPU path) runs the same calls eagerly."""
        if batch < 1 or context < 1:
            raise UserError(f"capture(batch={batch}, context={context}): both must be at least 1")
        t0 = time.perf_counter()
        verifier = static.verifier(self)
        proposer = self.make_proposer()
        graphs = fixed_shape_graphs(proposer)
        if verifier is None and graphs is None:
            return 0.0
        with self._run_backend().active():
            if verifier is not None:
                verifier.prepare(batch, context, proposer.hidden_layers)
            if graphs is not None:
                graphs.pool.capacity = max(
                    graphs.pool.capacity, static.capacity_for(context + static.shapes.BUCKETS[-1] + 1)
                )
                for rows in range(batch, 0, -1):
                    self._draft_once(rows, self.make_proposer())
        self._now()
        return time.perf_counter() - t0

    def _draft_once(self, rows: int, proposer: Proposer) -> None:
        """A one-token prompt of ``rows`` rows read by ``proposer`` and one tree drafted: its
        fixed-shape call made on the lease the next call takes (released when it is dropped)."""
        from transformers import DynamicCache

        ids = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
        valid = torch.ones_like(ids, dtype=torch.bool)
        out = self.target(
            input_ids=ids,
            cache=DynamicCache(),
            use_cache=True,
            output_hidden_states=static.hidden_request(proposer.hidden_layers),
            logits_to_keep=1,
        )
        root = ids[:, 0]
        proposer.prefill(Prefill(out.hidden_states, ids, valid, torch.zeros_like(ids), root))
        proposer.propose(root, torch.ones_like(root))

    def _drafter_modules(self) -> list[nn.Module]:
        if self.drafter is None:
            return []
        return [self.drafter, *getattr(self.drafter, "runtime_modules", list)()]  # a reduced draft head, say

    def _choose_backends(self) -> list[backend_choice.Choice]:
        """Set ``backend`` and ``drafter_backend`` by measurement (decode/backend_choice.py)."""
        self.drafter_layers = backend_choice.own_layers(self._drafter_modules(), self.target)
        picked = backend_choice.pick(
            self.config.backend,
            self.backend,
            self.target,
            self.drafter_layers,
            self.config.cost_cache,
            self.packs,
        )
        self.backend, self.drafter_backend, choices = picked
        return choices

    def backend_lines(self) -> list[str]:
        """One line per part saying which backend runs it and what each candidate's call cost."""
        return [c.line() for c in self.choices]

    def _run_backend(self) -> backends.Backend:
        """This call's backend over the target and the drafter (packed weights, checked)."""
        return backend_choice.run_backend(self, self._drafter_modules())

    # -- the three phases ---------------------------------------------------------------------
    def prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor | None,
        how: Sampling,
        stopper: Stopper,
        stats: DecodeStats,
    ) -> tuple[State, list[list[int]]]:
        """Read the prompts into the cache; the first new token of each row; start the proposer."""
        from transformers import DynamicCache

        B, P = ids.shape
        valid = mask if mask is not None else torch.ones_like(ids, dtype=torch.bool)
        positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
        proposer = self.make_proposer()
        cache = DynamicCache()
        out = self.target(
            input_ids=ids,
            attention_mask=additive_mask(padded_causal(valid), self.dtype),
            position_ids=positions,
            cache=cache,
            use_cache=True,
            output_hidden_states=static.hidden_request(proposer.hidden_layers),
            logits_to_keep=1,
        )
        stats.target_forwards += 1
        prompts = [[t for t, v in zip(r, m) if v] for r, m in zip(ids.tolist(), valid.tolist())]
        # the prompt's last token is the "root" whose logits give the first new token
        last = ids[:, -1:]
        scores = how.processing(out.logits[:, -1:], list(range(B)), prompts, last, torch.zeros_like(last))
        root = draw(scores[:, 0].softmax(-1), how.uniforms[:, 0]) if how.sample else scores[:, 0].argmax(-1)
        proposer.prefill(Prefill(out.hidden_states, ids, valid, positions, root))
        state = State(
            cache=cache,
            kv_valid=valid,
            lengths=torch.full((B,), P, device=self.device),
            lengths_cpu=[P] * B,
            pos=positions[:, -1] + 1,
            root=root,
            active=list(range(B)),
            generated=[[] for _ in range(B)],
            prompts=prompts,
            proposer=proposer,
        )
        first: list[list[int]] = [[] for _ in range(B)]
        for b, t in enumerate(root.tolist()):
            kept, done = stopper.cut(state.generated[b], [t], b)
            state.generated[b] += kept
            first[b] = kept
            if done:
                state.finished.append(b)
        stats.new_tokens += B
        return state, first

    def retire(self, state: State) -> bool:
        """Drop the rows that finished at the last step; whether any row is still active."""
        if not state.finished:
            return bool(state.active)
        keep = [i for i, b in enumerate(state.active) if b not in state.finished]
        state.active = [state.active[i] for i in keep]
        state.finished = []
        if not state.active:
            return False
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        kv.select_rows(state.cache, rows)
        state.proposer.select_rows(rows)
        state.kv_valid, state.lengths, state.pos, state.root = (
            t.index_select(0, rows) for t in (state.kv_valid, state.lengths, state.pos, state.root)
        )
        state.lengths_cpu = [state.lengths_cpu[i] for i in keep]
        if state.planner is not None:
            state.planner.batch = len(state.active)
        return True

    def step(self, state: State, how: Sampling, stopper: Stopper, stats: DecodeStats) -> list[list[int]]:
        """One draft-verify step for every active row; returns each input row's new tokens."""
        t0 = self._now()
        planner = state.planner
        skip = planner is not None and self.drafter is not None and not planner.drafting()
        plan = Plan(planner.depth) if planner is not None and not skip else None
        if skip:  # drafting does not pay now: lookup branches alone (no model), or a plain step
            lookup = getattr(state.proposer, "lookup", None)
            tree = lookup.propose(state.root, state.pos) if lookup is not None else single_node(state.root)
        else:
            tree = state.proposer.propose(state.root, state.pos, plan)
        tree = cap_depth(tree, self._depth_caps(state, how))  # no node past max_new_tokens or the positions
        draft_s = self._now() - t0
        if state.planner is not None:
            state.planner.draft_s = draft_s
            scores, valid = read_scores(tree, plan.expanded if plan is not None else None, state.planner)
            n = state.planner.choose(scores[:, 1:], valid[:, 1:], drafted=not skip)
            kept = torch.where(valid, scores, 0.0)[:, 1:].sort(dim=-1, descending=True).values[:, :n]
            predicted = float(kept.sum())  # Σ p of the nodes prune keeps: each row's n best valid ones
            tree = prune(tree, n)
        else:  # nothing prunes: drop the columns no row uses (a lookup chain's shared tokens, capped nodes)
            tree = drop_padding(tree, tree.valid.any(0).tolist())  # the step's one read of the tree
        t1 = self._now()
        stats.draft_time_s += t1 - t0
        best, bonus, out = self._verify(state, tree, how)
        forward_s = self._now() - t1 if planner is not None else 0.0  # what the cost curve times
        n_keep, host = self._accept(state, tree, best, bonus, out)
        del out
        verify_s = self._now() - t1
        stats.verify_time_s += verify_s
        if state.planner is not None:
            passes = 0 if skip else getattr(state.proposer, "passes", 0)
            state.planner.observe(draft_s, passes, forward_s, len(state.active) * tree.size)
            stats.undrafted_steps += skip
            state.planner.calibrate(predicted, float(sum(h[0] - 1 for h in host)))
        stats.target_forwards += 1
        stats.tree_tokens.append(tree.size)
        new: list[list[int]] = [[] for _ in range(len(state.generated))]
        for i, b in enumerate(state.active):
            n = host[i][0]
            kept, done = stopper.cut(state.generated[b], host[i][1 : 1 + n], b)
            state.generated[b] += kept
            new[b] = kept
            stats.new_tokens += len(kept)
            stats.accepted_lengths.append(len(kept))
            stats.accepted_depths.append(n - 1)
            if done:
                state.finished.append(b)
        return new

    def _verify(self, state: State, tree: Tree, how: Sampling):
        """The target's forward over the tree, and the accepted node and bonus token per row."""
        anc = static.ancestors(tree.parents)  # no host read of the tree's depth
        # static shapes / CUDA graphs (decode/static/): on for decode.backend=cuda-graphs
        verifier = static.verifier(self)
        if verifier is not None:
            out = verifier(state, tree, anc, state.proposer.hidden_layers)
        else:
            out = self.target(
                input_ids=tree.tokens,
                attention_mask=tree_mask(state.kv_valid, anc, self.dtype),
                position_ids=state.pos[:, None] + tree.depths,
                cache=state.cache,
                use_cache=True,
                output_hidden_states=static.hidden_request(state.proposer.hidden_layers),
            )
        rows = state.active
        histories = [state.prompts[b] + state.generated[b] for b in rows]
        scores = how.processing(out.logits, rows, histories, tree.tokens, tree.parents)
        args = (tree.tokens, tree.parents, tree.depths, anc)
        if not how.sample:
            best, bonus = greedy_accept(scores, *args, tree.valid)
        else:
            # column d: the uniform of the token after a node at depth d, by output position
            at = [[min(len(state.generated[b]) + d, how.max_new - 1) for d in range(tree.size)] for b in rows]
            uniforms = how.uniforms[rows].gather(1, torch.tensor(at, device=self.device))
            probs = scores.float().softmax(-1)
            if how.typical:
                c = self.config
                best, bonus = typical_accept(
                    probs, *args, uniforms, c.typical_epsilon, c.typical_delta, tree.valid
                )
            else:
                best, bonus = sample_accept(probs, *args, uniforms, tree.valid)
        return best, bonus, (out, anc)

    def _accept(self, state: State, tree: Tree, best, bonus, out) -> tuple[torch.Tensor, list[list[int]]]:
        """Keep the accepted path in the target's cache, tell the proposer, advance the state."""
        out, anc = out
        S = state.kv_valid.shape[1]
        path = path_nodes(anc, best, tree.size)  # [b, T]: root, accepted drafts, then padding
        n_keep = tree.depths.gather(1, best[:, None])[:, 0] + 1  # KV entries kept = tokens emitted
        emitted = tree.tokens.gather(1, path).roll(-1, dims=1)
        emitted.scatter_(1, (n_keep - 1)[:, None], bonus[:, None])
        host = torch.cat([n_keep[:, None], emitted], 1).tolist()  # the one sync of the step
        n_cpu = [h[0] for h in host]
        A = max(n_cpu)  # the longest accepted path, known on the host now
        path, emitted = path[:, :A], emitted[:, :A]
        new_len = max(a + n for a, n in zip(state.lengths_cpu, n_cpu))
        j = torch.arange(A, device=self.device)[None]
        kv.compact(state.cache, S + path, state.lengths[:, None] + j, new_len)
        state.kv_valid = kv.append_valid(state.kv_valid, state.lengths, j < n_keep[:, None], new_len)
        state.lengths = state.lengths + n_keep
        state.lengths_cpu = [a + n for a, n in zip(state.lengths_cpu, n_cpu)]
        emitted_cpu = [h[1 : 1 + n] for h, n in zip(host, n_cpu)]
        state.proposer.update(
            Accepted(out.hidden_states, path, emitted, n_keep, n_cpu, state.pos, emitted_cpu)
        )
        state.pos = state.pos + n_keep
        state.root = bonus
        return n_keep, host

    # -- helpers ----------------------------------------------------------------------------
    def _now(self) -> float:
        """Wall time after the device has finished its queued work (CUDA runs asynchronously)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _depth_caps(self, state: State, how: Sampling) -> torch.Tensor:
        """Per active row, the deepest tree node worth verifying (decode/context.py)."""
        left = [how.max_new - len(state.generated[b]) for b in state.active]
        positions = [len(state.prompts[b]) + len(state.generated[b]) - 1 for b in state.active]
        return torch.tensor(depth_caps(left, positions, self.limit), device=self.device)

    def _check_length(self, total: int) -> None:
        c = self.target.config
        window = getattr(c, "sliding_window", None)
        if window and getattr(c, "use_sliding_window", True) and total > window:
            raise UserError(
                f"prompt + max_new_tokens = {total} exceeds the target's sliding window {window}; "
                "tree decoding masks full attention only, so shorten the request"
            )


def fixed_shape_graphs(proposer: Proposer) -> static.Graphs | None:
    """The graphs hook ``proposer`` drafts through (inside a lookup combination), if any."""
    inner = getattr(proposer, "proposer", proposer)
    return getattr(inner, "graphs", None)


def read_scores(tree: Tree, expanded: Expanded | None, planner: Planner) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree's scores (a NaN as 0, as prune ranks it lowest) and valid flags on the host, in one
    transfer with what an EAGLE-2 expansion drafted, from which the planner sets the next depth."""
    T = tree.size
    fields = [tree.scores.float(), tree.valid.float()]
    if expanded is not None:
        fields += [expanded.scores.float(), expanded.frontiers.flatten(1).float()]
    host = torch.cat(fields, 1).cpu()  # one transfer
    if expanded is not None:
        C = expanded.scores.shape[1]
        frontiers = host[:, 2 * T + C :].reshape(expanded.frontiers.shape)
        planner.replan(host[:, 2 * T : 2 * T + C], frontiers, expanded.counts, expanded.cap)
    return host[:, :T].nan_to_num(0.0), host[:, T : 2 * T].bool()


def check_left_padded(mask: torch.Tensor | None) -> None:
    """Refuse a right-padded batch: the decoder continues every row from its last column."""
    if mask is None or mask.shape[1] < 2:
        return
    bad = (mask[:, :-1] & ~mask[:, 1:]).any(-1) | ~mask[:, -1]
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise UserError(
            f"attention_mask row {row} has padding after its tokens (right padding); pad prompts on the "
            "left (tokenizer.padding_side='left') so every row ends with a real token"
        )


def output_uniforms(rows: int, max_new: int, generator: torch.Generator | None, device) -> torch.Tensor:
    """``[rows, max_new]`` uniforms, one per input row and output position, drawn before decoding
    from ``generator`` (torch's default CPU generator when None) so that they do not depend on
    the trees the call verifies."""
    where = generator.device if generator is not None else "cpu"
    return torch.rand(rows, max_new, generator=generator, device=where).to(device)
