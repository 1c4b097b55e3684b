"""A self-contained check of the decoder on a GPU machine: ``python bench/gpu_check.py``.

It needs only PyTorch and transformers (nothing is downloaded, no other dependency of this
project is imported): the repository's ``conf/``, ``heads/`` and ``decode/`` folders are put on
``sys.path`` as the ``draftheads`` package through a temporary directory of symlinks. Targets
are random-initialised Llama models of about 1B and 8B shape, built in bf16 on the device.

Sections printed, per target:

* verify-cost curve: one target forward over n = 1..64 new tokens after 128 cached ones;
* drafting cost: one EAGLE-3 draft pass (top-k nodes through the drafter, with its cache) and
  one Medusa step (4 heads, their top-k);
* greedy identity: tree decoding (EAGLE-3 dynamic trees from a random drafter with lookup
  branches, and lookup alone) against the target's own greedy ``generate`` on random prompts,
  per backend: the fraction of prompts and of tokens that match (bf16 ties can flip a rare
  argmax);
* decoder overhead: a decoding step's time minus the target's bare forward over the same
  number of tree tokens, eager and cuda-graphs.

``--device cpu --small`` runs the same code on tiny float32 models in seconds (the tests do);
there the ``cuda-graphs`` rows run the static-shape path without capture (``static``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("conf", "heads", "decode")
BUDGET_S = 300

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


def build_drafters(target, small: bool):
    """A random EAGLE-3 drafter and 4 random Medusa heads for ``target``, on its device and dtype."""
    from draftheads.heads import EagleDrafter, MedusaHeads, fingerprint

    p = next(target.parameters())
    fp = fingerprint(target)
    torch.manual_seed(1)
    with building(p.device, p.dtype):
        vocab = 256 if small else 32000
        eagle = EagleDrafter(fp, target_config=target.config.to_dict(), version=3, draft_vocab_size=vocab)
        medusa = MedusaHeads(fp, num_heads=4)
    eagle.attach(target).init_lm_head_from_target()
    medusa.attach(target)
    return eagle.eval().requires_grad_(False), medusa.eval().requires_grad_(False)


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


# ---- sections --------------------------------------------------------------------------------
def verify_curve(target, repeats: int):
    """The verify-cost curve (eager, DynamicCache, 4-D mask), printed; returned for the overhead."""
    from draftheads.decode.cost import measure_curve

    curve = measure_curve(target, "eager", sizes=CURVE_SIZES, context=128, repeats=repeats)
    print("  new tokens   ms      x c(1)")
    for n, s in zip(curve.sizes, curve.seconds):
        print(f"  {n:>10}   {1000 * s:7.2f}  {s / curve.seconds[0]:6.2f}")
    return curve


@torch.no_grad()
def drafting_cost(target, eagle, medusa, repeats: int, k: int = 4, context: int = 128) -> None:
    """One EAGLE-3 draft pass over ``k`` nodes after ``context`` cached pairs; one Medusa step."""
    from transformers import DynamicCache

    from draftheads.decode import kv
    from draftheads.heads.masks import additive_mask

    p = next(target.parameters())
    dev, dtype, H = p.device, p.dtype, target.config.hidden_size
    gen = torch.Generator(device=dev).manual_seed(0)
    vocab = target.config.vocab_size
    cache = DynamicCache()
    feats = torch.randn(1, context, 3 * H, device=dev, dtype=dtype, generator=gen)
    tokens = torch.randint(0, vocab, (1, context), device=dev, generator=gen)
    eagle(tokens, eagle.fuse(feats), torch.arange(context, device=dev)[None], None, cache)
    nodes = torch.randint(0, vocab, (1, k), device=dev, generator=gen)
    hidden = torch.randn(1, k, H, device=dev, dtype=dtype, generator=gen)
    positions = torch.full((1, k), context, device=dev)
    allowed = torch.cat(
        [torch.ones(k, context, dtype=torch.bool, device=dev), torch.eye(k, dtype=torch.bool, device=dev)], 1
    )
    mask = additive_mask(allowed[None], dtype)

    def eagle_pass() -> None:
        out = eagle(nodes, hidden, positions, mask, cache)
        eagle.logits(out).float().log_softmax(-1).topk(k, dim=-1)
        kv.truncate(cache, context)

    last = torch.randn(1, H, device=dev, dtype=dtype, generator=gen)

    def medusa_step() -> None:
        for logits in medusa.heads_logits(medusa.head_hidden(last, 4)):
            logits.float().softmax(-1).topk(k, dim=-1)

    bare = median_ms(lambda: target(input_ids=nodes[:, :1], logits_to_keep=1), dev, repeats)
    print(
        f"  EAGLE-3 draft pass ({k} nodes, {context} cached): {median_ms(eagle_pass, dev, repeats):7.2f} ms"
    )
    print(f"  Medusa step (4 heads, top-{k}):                 {median_ms(medusa_step, dev, repeats):7.2f} ms")
    print(f"  (target forward, 1 token, no cache:             {bare:7.2f} ms)")


def random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    """Random prompts; every other one repeats its first half, so lookup branches find matches."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(1, vocab, (length,), generator=g)
        if i % 2:
            ids[length // 2 :] = ids[: length - length // 2]
        out.append(ids[None])
    return out


def decoder(target, eagle, backend: str, lookup: bool, total_tokens: int = 16):
    """A SpeculativeGenerator for ``backend``: ``static`` is the static-shape path without capture."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.static import StaticVerifier

    cfg = DecodeConfig(
        backend="eager" if backend == "static" else backend,
        tree="auto",
        dynamic=True,
        top_k_draft=4,
        depth=4,
        total_tokens=total_tokens,
        lookup=lookup,
        cost_aware=False,
    )
    gen = SpeculativeGenerator(target, eagle, None, cfg)
    if backend == "static":
        gen.static_verifier = StaticVerifier(target, capture=False)
    return gen


@torch.no_grad()
def greedy_identity(target, eagle, backends: list[str], prompts, new: int) -> None:
    """Tree decoding against ``target.generate`` (greedy), per backend and drafting method."""
    dev = next(target.parameters()).device
    refs = []
    for ids in prompts:
        ids = ids.to(dev)
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        refs.append(out[0, ids.shape[1] :].tolist())
    print("  backend       drafting          prompts identical   tokens matching   tau")
    for backend in backends:
        for name, drafter in (("eagle3+lookup", eagle), ("lookup", None)):
            gen = decoder(target, drafter, backend, lookup=True)
            same, match, total, taus = 0, 0, 0, []
            for ids, ref in zip(prompts, refs):
                ids = ids.to(dev)
                out = gen.generate(ids, max_new_tokens=new)[0, ids.shape[1] :].tolist()
                same += out == ref
                first_diff = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), len(ref))
                match, total = match + first_diff, total + len(ref)
                taus.append(gen.last_stats.tau)
            print(
                f"  {backend:<12}  {name:<16}  {same}/{len(prompts)} = {same / len(prompts):4.2f}"
                f"         {match / total:6.3f}         {statistics.mean(taus):4.2f}"
            )


@torch.no_grad()
def overhead(target, eagle, backends: list[str], curve, prompt, new: int) -> None:
    """Decoder step time minus the target's bare forward over the same tree size."""
    dev = next(target.parameters()).device
    ids = prompt.to(dev)
    print("  backend       tree  step ms  draft ms  verify+accept ms  bare fwd ms  overhead ms  excl. draft")
    for backend in backends:
        gen = decoder(target, eagle, backend, lookup=False)
        gen.generate(ids, max_new_tokens=new)  # warm-up: allocations, graph capture
        gen.generate(ids, max_new_tokens=new)
        st = gen.last_stats
        steps = max(st.steps, 1)
        size = statistics.mean(st.tree_tokens) if st.tree_tokens else 1
        step = 1000 * (st.total_time_s - st.prefill_time_s) / steps
        draft, verify = 1000 * st.draft_time_s / steps, 1000 * st.verify_time_s / steps
        bare = 1000 * curve(round(size))
        print(
            f"  {backend:<12}  {size:4.0f}  {step:7.2f}  {draft:8.2f}  {verify:16.2f}  {bare:11.2f}"
            f"  {step - bare:11.2f}  {step - draft - bare:11.2f}"
        )


def run(args: argparse.Namespace) -> None:
    from draftheads.conf.errors import UserError

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("no CUDA device here; run with --device cpu --small for the CPU check")
    dtype = torch.float32 if args.small else torch.bfloat16
    shapes = SMALL_SHAPES if args.small else SHAPES
    backends = ["eager", "cuda-graphs" if device.type == "cuda" else "static"]
    repeats = 2 if args.small else 5
    if args.small and device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: many small ops, where one thread is the fastest
    n_prompts, new = (2, 12) if args.small else (4, 32)
    t_start = time.perf_counter()
    print(f"gpu_check: torch {torch.__version__}, device {device}, dtype {dtype}")
    if device.type == "cuda":
        print(f"  {torch.cuda.get_device_name(device)}")
    for name, shape in shapes.items():
        t0 = time.perf_counter()
        target = build_target(shape, device, dtype)
        params = sum(p.numel() for p in target.parameters()) / 1e6
        print(f"\n### {name}: {params:,.1f}M parameters (built in {time.perf_counter() - t0:.1f} s)")
        eagle, medusa = build_drafters(target, args.small)
        print("== verify-cost curve ==")
        curve = verify_curve(target, repeats)
        print("== drafting cost ==")
        drafting_cost(target, eagle, medusa, repeats)
        prompts = random_prompts(shape[-1], n_prompts, 32 if args.small else 64)
        print(f"== greedy identity ({n_prompts} random prompts, {new} new tokens) ==")
        greedy_identity(target, eagle, backends, prompts, new)
        print("== decoder overhead ==")
        overhead(target, eagle, backends, curve, prompts[0], new)
        del target, eagle, medusa
        if device.type == "cuda":
            torch.cuda.empty_cache()
    elapsed = time.perf_counter() - t_start
    note = "" if elapsed <= BUDGET_S else f" (over the {BUDGET_S} s budget)"
    print(f"\ngpu_check done in {elapsed:.0f} s{note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="tiny float32 models (CPU check, tests)")
    args = parser.parse_args(argv)
    bootstrap()
    from draftheads.conf.errors import UserError

    try:
        run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
