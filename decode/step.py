"""The decoding loop's step: draft, prune, verify, accept, for every active row at once.

One step::

    tree  = proposer.propose(root, pos, plan)           # any drafter kind, lookup, or a mix
    tree  = prune(tree, n*)                             # only the nodes that pay (cost.py);
                                                        # not cost-aware: drop_padding(tree)
    out   = target(tree.tokens, 4-D tree mask, position_ids = pos + depth, cache)
    best, bonus = accept(out.logits, tree)              # greedy / rejection sampling / typical
    compact the target's KV: keep root + accepted path, drop the rest
    emit path tokens + bonus; the bonus is the next root

The target is a stock transformers model: the tree goes in as an additive 4-D attention mask
``[B, 1, T, S + T]`` (cache columns: the row's valid slots; tree columns: the ancestor mask)
with explicit ``position_ids``; transformers uses a 4-D mask as given. Nothing is forked.

Batches: rows accept different lengths. Row b owns cache slots ``[0, length[b])``; the
cache's physical length is the longest row's, and shorter rows' tails are masked (see kv.py).
Rows that finished leave the batch before the next step (:meth:`Stepping.retire`).

Counting: each step is one target forward; it yields (accepted drafts + 1 bonus) tokens, and
``tau`` is the mean of that over steps (tokens cut by EOS, a stop string or ``max_new_tokens``
are not counted). A step reads the device on the host at most twice: the tree's scores for the
planner (:func:`read_scores`) and the accepted tokens.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import kv, static
from draftheads.decode.context import cap_depth, depth_caps
from draftheads.decode.kv import tree_mask
from draftheads.decode.planner import Planner
from draftheads.decode.prefill import Sampling, State
from draftheads.decode.proposers.base import Accepted, Expanded, Plan, Tree, single_node
from draftheads.decode.select import drop_padding, leading_chain, prune
from draftheads.decode.stats import DecodeStats
from draftheads.decode.stop import Stopper
from draftheads.decode.tree import path_nodes
from draftheads.decode.verify import greedy_accept, sample_accept, typical_accept


class Stepping:
    """The step loop of :class:`~draftheads.decode.generator.SpeculativeGenerator` (mixed into
    it): reads its target, drafter, config, device, dtype and position limit."""

    target: nn.Module
    drafter: nn.Module | None
    recurrent: list[str]
    config: DecodeConfig
    device: torch.device
    dtype: torch.dtype
    limit: int | None

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
        planner = state.planner
        lookup = getattr(state.proposer, "lookup", None)
        level = lookup.level() if lookup is not None and planner is not None else 0
        skip = planner is not None and self.drafter is not None and not planner.drafting(level)
        plan = Plan(planner.depth, planner.trust) if planner is not None and not skip else None
        if skip:  # drafting does not pay now: lookup branches alone (no model), or a plain step
            tree = lookup.propose(state.root, state.pos) if lookup is not None else single_node(state.root)
        else:
            tree = state.proposer.propose(state.root, state.pos, plan)
        tree = cap_depth(tree, self._depth_caps(state, how))  # no node past max_new_tokens or the positions
        if self.recurrent:  # a recurrent state reads one sequence: verify the leading chain
            tree = leading_chain(tree, kv.RECURRENT_CHAIN)
        draft_s = stats.lap("draft", self._now())
        if planner is not None:
            planner.draft_s, planner.drafted = draft_s, self.drafter is not None and not skip
            scores, valid = read_scores(tree, plan.expanded if plan is not None else None, planner)
            n = planner.choose(scores[:, 1:], valid[:, 1:], drafted=planner.drafted)
            kept = torch.where(valid, scores, 0.0)[:, 1:].sort(dim=-1, descending=True).values[:, :n]
            predicted = float(kept.sum())  # Σ p of the nodes prune keeps: each row's n best valid ones
            tree = prune(tree, n)
        else:  # nothing prunes: drop the columns no row uses (a lookup chain's shared tokens, capped nodes)
            tree = drop_padding(tree, tree.valid.any(0).tolist())  # the step's one read of the tree
        stats.lap("planner", self._now())
        best, bonus, out = self._verify(state, tree, how)
        forward_s = stats.lap(
            "verify", self._now()
        )  # the forward and the acceptance rule: what the curve times
        n_keep, host = self._accept(state, tree, best, bonus, out)
        if self.recurrent:  # back to the state after the last accepted token
            kv.roll_back(state.cache, tree.size - host[0][0])
        del out
        if planner is not None:
            passes = 0 if skip else getattr(state.proposer, "passes", 0)
            planner.observe(draft_s, passes, forward_s, len(state.active) * tree.size)
            stats.undrafted_steps += skip
            planner.calibrate(predicted, float(sum(h[0] - 1 for h in host)))
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
        stats.lap("bookkeeping", self._now())
        return new

    def _verify(self, state: State, tree: Tree, how: Sampling):
        """The target's forward over the tree, and the accepted node and bonus token per row."""
        anc = static.ancestors(tree.parents)  # no host read of the tree's depth
        # static shapes / CUDA graphs (decode/static/): on for decode.backend=cuda-graphs
        verifier = static.verifier(self)
        if verifier is not None:
            out = verifier(state, tree, anc, state.proposer.hidden_layers)
        else:
            positions = state.pos[:, None] + tree.depths
            out = self.target(
                input_ids=tree.tokens,
                attention_mask=tree_mask(state.kv_valid, anc, self.dtype, self.target.config, positions),
                position_ids=positions,
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


def read_scores(tree: Tree, expanded: Expanded | None, planner: Planner) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree's scores (a NaN as 0, as prune ranks it lowest) and valid flags on the host, in one
    transfer with what a level-by-level expansion drafted, from which the planner sets the next depth."""
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
