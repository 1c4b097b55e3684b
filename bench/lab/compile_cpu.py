"""Is a compiled verify step faster on this CPU than the decoder's oneDNN eager step?

One target forward over ``n`` new tokens after a cached context of ``--context`` tokens, then
the argmax of its logits (the step :mod:`draftheads.decode.cost` measures), three ways:

* ``eager``: stock PyTorch linears (MKL) over a ``DynamicCache``;
* ``onednn``: the decoder's CPU default, linears on oneDNN-packed weights (``decode.backend=auto``);
* ``compiled``: the static verify forward (:class:`draftheads.decode.static.StaticVerifier`, the
  fixed-shape step that CUDA graphs capture) under ``torch.compile(fullgraph=True,
  dynamic=False)``; with inductor, freezing is on so that it pre-packs the weights as
  ``onednn`` does. Each size is one compiled graph; its compile time is printed.

Run on a quiet machine (nothing else on the cores)::

    python -m bench.lab.compile_cpu                 # SmolLM2-135M, sizes 1 and 8
    python -m bench.lab.compile_cpu --target tiny-llama --compiler aot_eager --repeats 2

Prints one row per size: median milliseconds per step for each way and the compiled step's
speed over ``onednn``'s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from draftheads.conf.schema.heads import TargetConfig
from draftheads.decode import cost, static


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall milliseconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def static_step(target, context: int, n: int, verifier: static.StaticVerifier):
    """``(entry, cache)``: a static cache holding ``context`` random tokens and the inputs of a
    causal ``n``-token step after them, written at slots ``context .. context + n - 1``."""
    from transformers import DynamicCache

    vocab = int(target.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    dyn = DynamicCache()
    target(input_ids=torch.randint(0, vocab, (1, context), generator=gen), cache=dyn, use_cache=True)
    cache = static.StaticKV.adopt(dyn, static.KVPool(), n)
    entry = verifier._entry(1, n, cache.capacity, False, cache.lease)
    entry.ids.copy_(torch.randint(0, vocab, (1, n), generator=gen))
    entry.pos.copy_(torch.arange(context, context + n)[None])
    chain = static.ancestors(torch.arange(-1, n - 1).clamp(min=0)[None])
    valid = torch.ones(1, context, dtype=torch.bool)
    entry.mask.copy_(static.static_mask(valid, chain, cache.capacity, verifier.dtype))
    entry.write.copy_(torch.arange(context, context + n))
    cache.write_index = entry.write
    return entry, cache


@torch.no_grad()
def compiled_ms(target, context: int, n: int, compiler: str, repeats: int) -> tuple[float, float, float]:
    """``(compile seconds, median ms, max |logit difference| from the uncompiled step)`` of the
    compiled static verify step over ``n`` tokens."""
    import torch._dynamo
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    inductor.freezing = compiler == "inductor"
    verifier = static.StaticVerifier(target, capture=False)
    entry, cache = static_step(target, context, n, verifier)
    reference = verifier.forward(entry, cache, False).logits
    step = torch.compile(verifier.forward, fullgraph=True, dynamic=False, backend=compiler)

    def run():
        return step(entry, cache, False).logits.argmax(-1)

    t0 = time.perf_counter()
    diff = float((step(entry, cache, False).logits - reference).abs().max())
    compile_s = time.perf_counter() - t0
    return compile_s, median_ms(run, repeats), diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2", help="smollm2 or tiny-<kind> (tiny-llama, ...)")
    parser.add_argument("--sizes", default="1,8", help="new tokens per step, comma-separated")
    parser.add_argument("--context", type=int, default=256, help="cached tokens before the step")
    parser.add_argument("--compiler", default="inductor", help="torch.compile backend")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    from draftheads.heads.target.load import load_target

    kind = args.target.removeprefix("tiny-")
    tcfg = TargetConfig() if args.target == "smollm2" else TargetConfig(name_or_path=args.target, tiny=kind)
    target, _ = load_target(tcfg)
    target.eval()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(
        f"target {args.target}, context {args.context}, threads {torch.get_num_threads()}, torch {torch.__version__}"
    )
    print(f"device {cost.device_name(torch.device('cpu'))}, compiler {args.compiler}")
    curves = {
        name: cost.measure_curve(target, name, sizes, args.context, args.repeats)
        for name in ("eager", "onednn")
    }
    print(
        "| new tokens | eager ms | onednn ms | compiled ms | compiled / onednn speed | compile s | max logit diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for i, n in enumerate(sizes):
        compile_s, ms, diff = compiled_ms(target, args.context, n, args.compiler, args.repeats)
        eager, onednn = (1000 * curves[k].seconds[i] for k in ("eager", "onednn"))
        row = f"| {n} | {eager:.2f} | {onednn:.2f} | {ms:.2f} | {onednn / ms:.2f}× | {compile_s:.1f} | {diff:.1e} |"
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
