"""The decoder's GPU check, decisive in one short run: ``python -u bench/gpu_check.py``.

It needs only PyTorch and transformers (nothing is downloaded, no other dependency of this
project is imported): the repository's ``conf/``, ``heads/`` and ``decode/`` folders are put on
``sys.path`` as the ``draftheads`` package through a temporary directory of symlinks. Targets
are random-initialised Llama models of about 1B and 8B shape, built on the device.

Every section prints a timestamped header and flushes each line; a section that fails prints
its traceback and the rest still run. Sections, per target shape:

* identity fp32: TF32 off, token-identical to the target's own greedy ``generate``, per
  backend, with an oracle drafter and with EAGLE-3 plus lookup branches (expected 1.00);
* identity bf16: the same in bf16; a divergence counts as a tie when the reference's
  top-1/top-2 margin at that token is within ``TIE_ULPS`` bf16 ulps, else as a failure;
* oracle tau: an oracle drafts each row's reference continuation (a chain with a wrong sibling
  at every depth) with right tokens at a set per-token rate, so tau = sum_j rate^j is known in
  advance; measured against it on a batch of 4 rows (accept, compaction and bucket paths);
* speed: tokens/s of stock ``generate``, the decoder's graph-replayed one-token loop, and
  speculative decoding with the oracle at rate 0.8, eager and cuda-graphs (the oracle and the
  speed runs use a target steered to a fixed greedy text, so bf16 rounding cannot flip it);
* compiled generate: ``generate`` with ``cache_implementation="static"`` and
  ``torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)``, as transformers
  documents it (CUDA only); then the speedups against the fastest plain baseline;
* verify cost: one forward over n new tokens on the path each backend runs (eager with a
  DynamicCache; the captured graph replayed at bucket sizes), and the decoder's per-step
  overhead against the bare forward of the same path and size;
* drafting: the fixed-shape EAGLE-3 draft step and DFlash's drafting call (the block pass and
  DDTree, ``draft_tree``, through the ``drafter_graphs`` hook), eager and captured.

Before a timed section replays graphs, ``SpeculativeGenerator.capture`` captures them (every
verify bucket, largest first) and the time it took is printed.

The header names the torch and transformers versions (the ones the decoder needs are checked
first), the device and the attention kernel a verify forward runs; CUDA sections add capture
times and ``max_memory_allocated``. ``--shapes NAME`` reruns one shape; ``--device cpu --small``
runs the same code on tiny models in seconds (the tests do), where ``static`` is the
cuda-graphs path without capture and times are not measurements.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("conf", "heads", "decode")
NEEDS = {"torch": "2.13", "transformers": "5.24"}  # transformers 5.24: the forward's cache= argument

# name: (hidden, layers, heads, kv heads, intermediate, vocab)
SHAPES = {
    "llama-1b": (2048, 16, 32, 8, 8192, 128256),
    "llama-8b": (4096, 32, 32, 8, 14336, 128256),
}
SMALL_SHAPES = {
    "small-a": (64, 4, 4, 2, 128, 512),
    "small-b": (96, 5, 4, 2, 192, 512),
}
CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64)
RATES = (0.6, 0.8)
DEPTH = 6  # the oracle's chain: 1 + 2 * DEPTH = 13 nodes, bucket 16
TIE_ULPS = 4  # a bf16 divergence within this margin of the reference's top-2 is a tie, not a bug
TAU_TOLERANCE = 0.05
MIN_STEPS = 200  # row-steps before the oracle's low-discrepancy plan is held to TAU_TOLERANCE
ATTENTION = r"attention|fmha|flash|sdpa|efficient"  # profiler names of attention ops and kernels
T0 = time.perf_counter()


def say(*args) -> None:
    print(*args, flush=True)


def stamp() -> str:
    return f"[{time.perf_counter() - T0:7.1f} s]"


def section(title: str, fn, *args, **kwargs):
    """Run one section: a timestamped header, its traceback on failure (the rest still run)."""
    say(f"\n== {title} == {stamp()}")
    try:
        return fn(*args, **kwargs)
    except Exception:
        say(traceback.format_exc().rstrip())
        say(f"!! section failed: {title}")
        return None
    finally:
        memory = ""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            memory = f", max_memory_allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
            torch.cuda.reset_peak_memory_stats()
        say(f"   ({title} done {stamp()}{memory})")


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def check_versions() -> str | None:
    """The first installed version older than the decoder needs, as a one-line fix."""
    import transformers

    for name, have in (("torch", torch.__version__), ("transformers", transformers.__version__)):
        if version(have) < version(NEEDS[name]):
            return f"{name} {have} is older than the {NEEDS[name]} the decoder needs; pip install '{name}>={NEEDS[name]}'"
    return None


def bootstrap() -> Path:
    """Make ``import draftheads.<conf|heads|decode>`` read this checkout, without installing it."""
    root = Path(tempfile.mkdtemp(prefix="draftheads-gpu-check-"))
    pkg = root / "draftheads"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""draftheads, from a source checkout."""\n')
    for name in PACKAGES:
        (pkg / name).symlink_to(REPO / name, target_is_directory=True)
    sys.path.insert(0, str(root))
    return root


@contextmanager
def building(device: torch.device, dtype: torch.dtype):
    """Create modules directly on ``device`` in ``dtype`` (no float32 copy on the host)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def build_target(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, seed: int = 0):
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
def steer(target) -> None:
    """Make the target's greedy text a fixed successor map (token t -> t + 1) with a wide margin:
    the embeddings dominate the residual stream and lm_head row t + 1 reads embedding t. Every
    layer still runs, so speed is unchanged, but bf16 rounding can no longer flip a token."""
    emb = target.get_input_embeddings().weight
    emb.mul_(50.0)
    unit = emb / emb.norm(dim=-1, keepdim=True)
    target.lm_head.weight.copy_(unit.roll(1, dims=0) * target.lm_head.weight.norm(dim=-1, keepdim=True))


def build_dflash(target, small: bool, layers: int = 5):
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


def build_eagle(target, small: bool):
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn()`` in ms, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> torch.Tensor:
    """``[n, length]`` random prompts; every other one repeats its first half (lookup finds matches)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    ids[1::2, length // 2 :] = ids[1::2, : length - length // 2]
    return ids


@torch.no_grad()
def references(target, prompts: torch.Tensor, new: int, logits: bool = False):
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


# ---- drafting: an oracle, EAGLE-3, and none ---------------------------------------------------
class Oracle:
    """Drafts each row's reference continuation: a chain of ``depth`` tokens and a wrong sibling at
    every depth. The number of right drafts per row-step follows a low-discrepancy sequence of
    the truncated geometric law P(k >= j) = rate^j, so tau = sum_{j=0..depth} rate^j.

    Positions are tracked on the host from what each step kept, so drafting reads nothing from
    the device. ``kept`` collects the tokens the decoder emitted per row-step (tau as verified),
    over the steps that had room for the whole chain before ``new`` tokens.
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, refs: list[list[int]], rate: float, depth: int, vocab: int, new: int) -> None:
        self.refs, self.rate, self.depth, self.vocab, self.new = refs, rate, depth, vocab, new
        self.u, self.kept, self.planned, self.full = 0.0, [], [], []

    def prefill(self, batch) -> None:
        self.rows = list(range(batch.input_ids.shape[0]))
        self.done = [1] * len(self.rows)  # tokens emitted so far per row (the root is ref[0])

    def right_drafts(self) -> int:
        self.u = (self.u + 0.6180339887498949) % 1.0
        k = 0
        while k < self.depth and self.u < self.rate ** (k + 1):
            k += 1
        return k

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan=None):
        from draftheads.decode.proposers.base import Tree

        D, V = self.depth, self.vocab
        tokens = []
        # a step counts towards tau when the row has room for the whole chain and its bonus
        # (nearer the end the decoder caps the tree's depth at the tokens left)
        self.full = [g + D + 1 <= self.new for g in self.done]
        for b, g, full in zip(self.rows, self.done, self.full):
            ref, k = self.refs[b], self.right_drafts()
            self.planned += [1 + k] * full
            truth = [ref[g + j] if g + j < len(ref) else 0 for j in range(D)]
            chain = [t if j < k else (t + V // 2) % V for j, t in enumerate(truth)]
            tokens.append([0] + chain + [(t + V // 3) % V for t in truth])
        parents = [0] + list(range(D)) + [0] + list(range(1, D))
        depths = [0] + list(range(1, D + 1)) * 2
        B, T, dev = len(tokens), 1 + 2 * D, root.device
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=dev)  # noqa: E731
        tok = as_long(tokens)
        tok[:, 0] = root
        return Tree(
            tok,
            as_long(parents).expand(B, T),
            as_long(depths).expand(B, T),
            torch.ones(B, T, device=dev),
            torch.ones(B, T, dtype=torch.bool, device=dev),
        )

    def update(self, step) -> None:
        self.kept += [n for n, full in zip(step.n_cpu, self.full) if full]
        self.done = [g + n for g, n in zip(self.done, step.n_cpu)]

    def select_rows(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.rows, self.done = [self.rows[i] for i in keep], [self.done[i] for i in keep]

    def tau(self) -> float:
        return statistics.mean(self.kept) if self.kept else float("nan")


class OneToken:
    """No drafts: every step verifies the root alone (plain greedy decoding on the decoder's path)."""

    hidden_layers: tuple[int, ...] = ()

    def prefill(self, batch) -> None:
        pass

    def propose(self, root: torch.Tensor, pos: torch.Tensor, plan=None):
        from draftheads.decode.proposers.base import single_node

        return single_node(root)

    def update(self, step) -> None:
        pass

    def select_rows(self, rows: torch.Tensor) -> None:
        pass


def expected_tau(rate: float, depth: int) -> float:
    return sum(rate**j for j in range(depth + 1))


def decoder(target, backend: str, drafting, eagle=None):
    """A SpeculativeGenerator on ``backend`` (``static``: the cuda-graphs path without capture)
    whose proposer is ``drafting()`` (or EAGLE-3 with lookup branches when it is None)."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator, static
    from draftheads.decode.proposers import WithLookup

    cfg = DecodeConfig(
        backend="eager" if backend == "static" else backend,
        dynamic=True,
        top_k_draft=4,
        depth=4,
        total_tokens=16,
        lookup=True,
        cost_aware=False,
    )
    gen = SpeculativeGenerator(target, eagle if drafting is None else None, None, cfg)
    if backend == "static":
        gen.static_verifier = static.shared(target, capture=False)
    make = gen.make_proposer

    def proposer():
        if drafting is not None:
            return drafting()
        out = make()
        inner = out.proposer if isinstance(out, WithLookup) else out
        if backend == "static":  # fixed-shape drafting, as cuda-graphs captures it
            inner.graphs = static.drafter_graphs(eagle, capture=False)
        return out

    gen.make_proposer = proposer
    return gen


def backends_for(device: torch.device) -> list[str]:
    return ["eager", "cuda-graphs" if device.type == "cuda" else "static"]


# ---- sections -----------------------------------------------------------------------------------
@torch.no_grad()
def environment(target, device: torch.device) -> None:
    """Versions, device, TF32 flags, and the attention kernel one verify forward runs."""
    import transformers

    say(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    if device.type == "cuda":
        say(f"  {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}")
        say(
            f"  tf32 matmul {torch.backends.cuda.matmul.allow_tf32}, sdpa flash "
            f"{torch.backends.cuda.flash_sdp_enabled()}, mem-efficient "
            f"{torch.backends.cuda.mem_efficient_sdp_enabled()}, cudnn {torch.backends.cuda.cudnn_sdp_enabled()}"
        )
    from torch.profiler import ProfilerActivity, profile

    from draftheads.heads.masks import additive_mask

    ids = torch.randint(1, target.config.vocab_size, (1, 16), device=device)
    allowed = torch.ones(16, 16, dtype=torch.bool, device=device).tril()
    mask = additive_mask(allowed[None], next(target.parameters()).dtype)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        target(input_ids=ids, attention_mask=mask, position_ids=torch.arange(16, device=device)[None])
    names = sorted({e.key for e in prof.key_averages() if re.search(ATTENTION, e.key, re.IGNORECASE)})
    say(f"  attention kernels of a 4-D-masked forward: {', '.join(names) or 'none found'}")


@torch.no_grad()
def identity(target, eagle, device, prompts, new: int, margins: bool) -> bool:
    """Tree decoding against the target's greedy ``generate``, per backend and drafting method.

    With ``margins`` (bf16), a prompt's first divergence is a tie when the reference's
    top-1/top-2 margin there is within ``TIE_ULPS`` bf16 ulps of its top-1 logit.
    """
    refs, logits = references(target, prompts, new, logits=margins)
    V = target.config.vocab_size
    say(
        "  backend       drafting         identical   tokens matching   tau"
        + ("   ties  FAILS" if margins else "")
    )
    ok = True
    for backend in backends_for(device):
        for name in ("oracle-0.8", "eagle3+lookup"):
            oracle = Oracle(refs, 0.8, DEPTH, V, new) if name.startswith("oracle") else None
            gen = decoder(target, backend, (lambda o=oracle: o) if oracle else None, eagle)
            same = match = ties = fails = 0
            taus = []
            for ids, ref, i in zip(prompts, refs, range(len(refs))):
                if oracle is not None:  # drafts past the reference's end are wrong, and rejected
                    oracle.refs = [ref]
                ids = ids[None].to(device)
                out = gen.generate(ids, max_new_tokens=new)[0, ids.shape[1] :].tolist()
                first = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), len(ref))
                same += first == len(ref)
                match += first
                taus.append(gen.last_stats.tau)
                if margins and first < len(ref):
                    top = logits[i][first].topk(2).values
                    ulp = 2.0 ** (math.floor(math.log2(max(abs(float(top[0])), 1e-30))) - 7)
                    tie = float(top[0] - top[1]) <= TIE_ULPS * ulp
                    ties, fails = ties + tie, fails + (not tie)
            total = len(refs) * new
            row = f"  {backend:<12}  {name:<15}  {same}/{len(refs)} = {same / len(refs):4.2f}      {match / total:6.3f}       {statistics.mean(taus):5.2f}"
            say(row + (f"   {ties:4d}  {fails:5d}" if margins else ""))
            ok &= (fails == 0) if margins else same == len(refs)
    say(
        f"  verdict: {'PASS' if ok else 'FAIL'}"
        + (f" (divergences above {TIE_ULPS} ulps fail)" if margins else " (expected 1.00)")
    )
    return ok


@torch.no_grad()
def oracle_tau(target, device, prompts, new: int) -> bool:
    """tau with the oracle at each set rate, on a batch: the decoder must keep exactly the drafts
    the oracle made right (measured = planned), and the plan must meet sum_j rate^j within
    ``TAU_TOLERANCE`` once ``MIN_STEPS`` row-steps are counted (fewer: reported only)."""
    refs, _ = references(target, prompts, new + DEPTH + 1)
    V = target.config.vocab_size
    ok = True
    say(f"  {len(prompts)} rows, chain depth {DEPTH} + a wrong sibling per depth ({1 + 2 * DEPTH} nodes)")
    say("  backend       rate   expected tau   measured tau   planned   row-steps   identical   trees")
    for backend in backends_for(device):
        for rate in RATES:
            oracle = Oracle(refs, rate, DEPTH, V, new)
            gen = decoder(target, backend, lambda o=oracle: o)
            out = gen.generate(prompts.to(device), max_new_tokens=new)[:, prompts.shape[1] :].tolist()
            same = sum(o[:new] == r[:new] for o, r in zip(out, refs))
            want, got, planned = expected_tau(rate, DEPTH), oracle.tau(), statistics.mean(oracle.planned)
            counted = len(oracle.kept) >= MIN_STEPS
            good = oracle.kept == oracle.planned and same == len(refs)
            good &= abs(got - want) <= TAU_TOLERANCE or not counted
            ok &= good
            say(
                f"  {backend:<12}  {rate:4.2f}   {want:12.3f}   {got:12.3f}   {planned:7.3f}   {len(oracle.kept):9d}"
                f"   {same}/{len(refs)}         {sorted(set(gen.last_stats.tree_tokens))}  {'ok' if good else 'OFF'}"
            )
    say(
        f"  verdict: {'PASS' if ok else 'FAIL'} (measured = planned, output identical, and within "
        f"{TAU_TOLERANCE} of the set rate over {MIN_STEPS}+ row-steps)"
    )
    return ok


def timed_tokens_per_s(fn, device: torch.device, new: int) -> float:
    """Tokens/s of ``fn()`` (one call generating ``new`` tokens), after one untimed call."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return new / (time.perf_counter() - t0)


@torch.no_grad()
def speed(target, device, prompt: torch.Tensor, new: int) -> dict:
    """Tokens/s (batch 1) of plain and speculative decoding; the oracle drafts at rate 0.8."""
    ids = prompt[None].to(device)
    refs, _ = references(target, prompt[None], new + DEPTH + 1)
    V = target.config.vocab_size
    graphs = backends_for(device)[1]
    rates: dict[str, float] = {}
    steps: dict[str, float] = {}

    def gen_stock():
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)

    rates["generate (stock)"] = timed_tokens_per_s(gen_stock, device, new)
    one = decoder(target, graphs, OneToken)
    capture_s = one.capture(batch=1, context=ids.shape[1] + new)
    say(f"  capture before timing, every verify bucket largest first ({graphs}): {capture_s:.2f} s")
    rates[f"one-token loop ({graphs})"] = timed_tokens_per_s(
        lambda: one.generate(ids, max_new_tokens=new), device, new
    )
    for backend in ("eager", graphs):
        oracle = Oracle(refs, 0.8, DEPTH, V, new)
        gen = decoder(target, backend, lambda o=oracle: o)
        gen.capture(batch=1, context=ids.shape[1] + new)  # the one-token loop's graphs serve it too
        rates[f"speculative {backend}, oracle 0.8"] = timed_tokens_per_s(
            lambda g=gen: g.generate(ids, max_new_tokens=new), device, new
        )
        st = gen.last_stats
        steps[backend] = 1000 * (st.total_time_s - st.prefill_time_s) / max(len(st.tree_tokens), 1)
        say(
            f"  speculative {backend}: tau {st.tau:.2f}, {steps[backend]:.2f} ms per step (tree {1 + 2 * DEPTH})"
        )
    report_rates(rates)
    return {"rates": rates, "step_ms": steps}


def report_rates(rates: dict[str, float]) -> None:
    """Tokens/s, and each speculative rate against stock generate and the fastest plain baseline."""
    plain = {k: v for k, v in rates.items() if not k.startswith("speculative")}
    fastest = max(plain, key=plain.get)
    stock = rates["generate (stock)"]
    say(f"  {'':<46} tokens/s   x generate   x fastest plain ({fastest})")
    for name, r in rates.items():
        say(f"  {name:<46} {r:8.1f}   {r / stock:9.2f}   {r / plain[fastest]:9.2f}")


@torch.no_grad()
def compiled_generate(target, device, prompt: torch.Tensor, new: int, found: dict) -> None:
    """``generate`` on a static cache with the forward compiled, as transformers documents it."""
    if device.type != "cuda":
        say("  skipped off CUDA (inductor's CPU compile takes minutes on a small machine)")
        return
    ids = prompt[None].to(device)
    target.generation_config.cache_implementation = "static"
    target.forward = torch.compile(target.forward, mode="reduce-overhead", fullgraph=True)
    try:
        t0 = time.perf_counter()
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        target.generate(ids, **kw)
        say(f"  first call (compiles): {time.perf_counter() - t0:.1f} s")
        rate = timed_tokens_per_s(lambda: target.generate(ids, **kw), device, new)
    finally:
        del target.forward
        target.generation_config.cache_implementation = None
        torch._dynamo.reset()
    if found:
        found["rates"]["generate (static cache, compiled)"] = rate
        report_rates(found["rates"])


@torch.no_grad()
def verify_cost(target, device, repeats: int, found: dict, context: int = 128) -> None:
    """A bare verify forward per size on each backend's own path, and the decoder's overhead."""
    from transformers import DynamicCache

    from draftheads.decode import static
    from draftheads.decode.kv import tree_mask

    verifier = static.StaticVerifier(target, capture=device.type == "cuda")
    prompt = torch.randint(1, target.config.vocab_size, (1, context), device=device)
    valid = torch.ones(1, context, dtype=torch.bool, device=device)
    eager_ms, graph_ms = {}, {}
    tree = 1 + 2 * DEPTH  # the oracle's tree: eager verifies it as is, graphs at its bucket
    sizes = sorted({*CURVE_SIZES, tree})
    for n in sizes:
        cache = DynamicCache()
        target(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
        chain = static.ancestors(torch.arange(n, device=device).clamp_min(1)[None] - 1)
        ids = torch.randint(1, target.config.vocab_size, (1, n), device=device)
        pos = torch.arange(context, context + n, device=device)[None]
        mask = tree_mask(valid, chain, verifier.dtype)

        def eager(ids=ids, pos=pos, mask=mask, cache=cache, n=n):
            target(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
            cache.crop(-n)

        eager_ms[n] = median_ms(eager, device, repeats)
        kv = static.StaticKV.adopt(cache, verifier.pool, static.shapes.BUCKETS[-1] + 1)
        entry = verifier._entry(1, n, kv.capacity, True, kv.lease)
        entry.ids.copy_(ids)
        entry.pos.copy_(pos)
        entry.mask.copy_(static.static_mask(valid, chain, kv.capacity, verifier.dtype))
        entry.write.copy_(pos[0])
        kv.write_index = entry.write
        if verifier.capture:
            verifier._replay(entry, kv, True)  # captures
            graph_ms[n] = median_ms(entry.graph.replay, device, repeats)
        else:
            graph_ms[n] = median_ms(lambda e=entry, c=kv: verifier.forward(e, c, True), device, repeats)
    graphs = backends_for(device)[1]
    say(f"  new tokens   eager ms   {graphs} ms   eager x c(1)   {graphs} x c(1)")
    for n in sizes:
        say(
            f"  {n:>10}   {eager_ms[n]:8.3f}   {graph_ms[n]:10.3f}   {eager_ms[n] / eager_ms[1]:12.2f}"
            f"   {graph_ms[n] / graph_ms[1]:9.2f}"
        )
    if not found:
        return
    size = tree
    bare = {"eager": eager_ms[size], graphs: graph_ms[static.bucket(size)]}
    say(
        f"  decoder step (oracle tree of {size}, bucket {static.bucket(size)}) against the bare forward of its path:"
    )
    for backend, ms in found["step_ms"].items():
        over = ms - bare[backend]
        say(
            f"  {backend:<12} step {ms:8.3f} ms   bare {bare[backend]:8.3f} ms   overhead {over:8.3f} ms = {100 * over / bare[backend]:6.1f}%"
        )


@torch.no_grad()
def drafting(target, eagle, dflash, device, repeats: int, context: int = 128) -> None:
    """The fixed-shape drafting calls after ``context`` cached positions, eager and captured."""
    eagle_step(target, eagle, device, repeats, context=context)
    dflash_step(target, dflash, device, repeats, context=context)


def eagle_step(target, eagle, device, repeats: int, k: int = 4, depth: int = 4, context: int = 128) -> None:
    """The fixed-shape EAGLE-3 draft step after ``context`` cached pairs, eager and captured."""
    from transformers import DynamicCache

    from draftheads.decode import static
    from draftheads.decode.proposers.eagle import fixed_tree

    p = next(target.parameters())
    H, n = target.config.hidden_size, 15
    g = torch.Generator(device=device).manual_seed(0)
    feats = torch.randn(1, context, 3 * H, device=device, dtype=p.dtype, generator=g)
    tokens = torch.randint(0, target.config.vocab_size, (1, context), device=device, generator=g)
    cache = DynamicCache()
    eagle(tokens, eagle.fuse(feats), torch.arange(context, device=device)[None], None, cache)
    root = tokens[:, -1]
    pos = torch.full((1,), context, device=device)
    h_root = torch.randn(1, H, device=device, dtype=p.dtype, generator=g)
    for capture in sorted({False, device.type == "cuda"}):
        graphs = static.Graphs(device, capture=capture)
        kv = static.StaticKV.adopt(cache, graphs.pool, (depth - 1) * k)
        valid = torch.zeros(1, kv.capacity, dtype=torch.bool, device=device)
        valid[:, :context] = True
        base = torch.full((), context, device=device)

        def step(valid, base, root, pos, h_root, kv=kv):
            return fixed_tree(eagle, kv, valid, base, root, pos, h_root, k, depth, n)

        args = (valid, base, root, pos, h_root)
        ms = median_ms(lambda g=graphs, f=step, a=args: g.run(("eagle", 1), f, *a), device, repeats)
        how = "captured" if capture else "eager"
        extra = f" (capture {graphs.capture_s:.2f} s)" if capture else ""
        say(
            f"  EAGLE-3 draft step, top-{k}, depth {depth}, {n} nodes, {context} cached, {how}: {ms:8.3f} ms{extra}"
        )


def dflash_step(target, dflash, device, repeats: int, k: int = 4, n: int = 15, context: int = 128) -> None:
    """DFlash's drafting call, ``draft_tree`` (the block pass over fixed-capacity context buffers,
    each position's top-``k``, DDTree's ``n`` best paths), after ``context`` cached positions,
    through the ``drafter_graphs`` hook: eager, and captured (one graph) on CUDA."""
    from draftheads.decode import static
    from draftheads.decode.proposers.dflash import draft_tree

    p = next(target.parameters())
    H, drafts = target.config.hidden_size, dflash.block_size - 1
    F = len(dflash.feature_layers()) * H
    g = torch.Generator(device=device).manual_seed(0)
    feats = torch.randn(1, context, F, device=device, dtype=p.dtype, generator=g)
    positions = torch.arange(context, device=device)[None]
    root = torch.randint(0, target.config.vocab_size, (1,), device=device, generator=g)
    pos = torch.full((1,), context, device=device)
    for capture in sorted({False, device.type == "cuda"}):
        graphs = static.drafter_graphs(dflash, capture=capture)
        kv = static.StaticKV(graphs.pool, dflash.num_decoder_layers)
        for layer, (key, value) in zip(kv.layers, dflash.context_kv(feats, positions)):
            layer.keys, layer.values = key, value  # the context in the lease's buffers
        valid = torch.zeros(1, kv.capacity, dtype=torch.bool, device=device)
        valid[:, :context] = True

        def step(valid, root, pos, kv=kv):
            buffers = [(layer.k_buf, layer.v_buf) for layer in kv.layers]
            return draft_tree(dflash, buffers, valid, root, pos, None, drafts, k, n)

        key = ("dflash", 1, kv.capacity, kv.lease, drafts, k, n, 0)
        args = (valid, root, pos)
        ms = median_ms(lambda gr=graphs, f=step, a=args, key=key: gr.run(key, f, *a), device, repeats)
        how = "captured" if capture else "eager"
        extra = f" (capture {graphs.capture_s:.2f} s)" if capture else ""
        say(
            f"  DFlash draft call, block {dflash.block_size}, {dflash.num_decoder_layers} layers, top-{k}, "
            f"DDTree {n} nodes, {context} cached, {how}: {ms:8.3f} ms{extra}"
        )


# ---- driver ---------------------------------------------------------------------------------------
def run_shape(name: str, shape, device: torch.device, small: bool, first: bool) -> None:
    repeats = 2 if small else 10
    n_prompts, new, plen = (2, 12, 24) if small else (4, 64, 64)
    vocab = shape[-1]
    prompts = random_prompts(vocab, n_prompts, plen)
    say(f"\n### {name}: hidden {shape[0]}, {shape[1]} layers, vocab {vocab} {stamp()}")
    if first or small:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        target = build_target(shape, device, torch.float32)
        section(
            f"{name}: identity fp32 (TF32 off)",
            identity,
            target,
            build_eagle(target, small),
            device,
            prompts,
            new,
            False,
        )
        del target
        free(device)
    dtype = torch.bfloat16
    target = build_target(shape, device, dtype)
    say(f"  {sum(p.numel() for p in target.parameters()) / 1e6:,.1f}M parameters, {dtype}")
    eagle, dflash = build_eagle(target, small), build_dflash(target, small)
    section(f"{name}: environment", environment, target, device)
    section(
        f"{name}: identity bf16 (ties within {TIE_ULPS} ulps)",
        identity,
        target,
        eagle,
        device,
        prompts,
        new,
        True,
    )
    section(f"{name}: drafting", drafting, target, eagle, dflash, device, repeats)
    steer(target)
    rows = random_prompts(vocab, 4, plen, seed=1)
    section(f"{name}: oracle tau", oracle_tau, target, device, rows, 40 if small else 256)
    found = section(f"{name}: speed", speed, target, device, rows[0], 2 * new) or {}
    section(f"{name}: compiled generate", compiled_generate, target, device, rows[0], 2 * new, found)
    section(f"{name}: verify cost and overhead", verify_cost, target, device, repeats, found)
    del target, eagle, dflash
    free(device)


def free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="tiny models (the CPU check, tests)")
    parser.add_argument("--shapes", default="", help="comma-separated shape names to run (default: all)")
    args = parser.parse_args(argv)
    problem = check_versions()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    bootstrap()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; run with --device cpu --small for the CPU check", file=sys.stderr)
        return 1
    shapes = SMALL_SHAPES if args.small else SHAPES
    chosen = [s for s in args.shapes.split(",") if s] or list(shapes)
    unknown = [s for s in chosen if s not in shapes]
    if unknown:
        print(f"error: unknown shape {unknown[0]}; use one of {', '.join(shapes)}", file=sys.stderr)
        return 1
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: many small ops, where one thread is the fastest
    say(f"gpu_check {stamp()}: shapes {', '.join(chosen)} on {device}")
    for i, name in enumerate(chosen):
        run_shape(name, shapes[name], device, args.small, first=i == 0)
    say(f"\ngpu_check done {stamp()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
