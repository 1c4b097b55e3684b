"""The decoder's GPU check, decisive in one short run: ``python -u -m bench.lab.gpu_check``
from the top of a checkout (it is a maintainer's tool, not installed).

It needs only PyTorch and transformers (nothing is downloaded, no other dependency of this
project is imported): the package ``draftheads`` is this checkout's top folder, so its
``conf/``, ``heads/`` and ``decode/`` are what is checked, installed or not (:func:`bootstrap`).
Targets are random-initialised Llama models of about 1B and 8B shape, built on the device. Each
section is a module of ``bench/lab/gpu/``; this file runs them in order.

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
import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path

import torch

from .gpu.drafting import drafting
from .gpu.environment import environment
from .gpu.identity import TIE_ULPS, identity
from .gpu.log import say, section, stamp
from .gpu.models import SHAPES, SMALL_SHAPES, build_dflash, build_eagle, build_target, random_prompts, steer
from .gpu.oracle_tau import oracle_tau
from .gpu.speed import compiled_generate, speed
from .gpu.verify_cost import verify_cost

REPO = Path(__file__).resolve().parents[2]
NEEDS = {"torch": "2.13", "transformers": "5.24"}  # transformers 5.24: the forward's cache= argument


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def check_versions() -> str | None:
    """The first installed version older than the decoder needs, as a one-line fix."""
    import transformers

    for name, have in (("torch", torch.__version__), ("transformers", transformers.__version__)):
        if version(have) < version(NEEDS[name]):
            return f"{name} {have} is older than the {NEEDS[name]} the decoder needs; pip install '{name}>={NEEDS[name]}'"
    return None


def bootstrap() -> None:
    """Make ``import draftheads.<conf|heads|decode>`` read this checkout, installed or not: the
    package ``draftheads`` is the checkout's top folder, its subpackages the folders there, as
    pyproject's package-dir maps them (a bare GPU machine needs no install). Left as it is when
    ``draftheads`` was imported already."""
    if "draftheads" in sys.modules:
        return
    spec = importlib.machinery.ModuleSpec("draftheads", None, is_package=True)
    spec.submodule_search_locations = [str(REPO)]
    sys.modules["draftheads"] = importlib.util.module_from_spec(spec)


def run_shape(name: str, shape: tuple[int, ...], device: torch.device, small: bool, first: bool) -> None:
    """Every section on one target shape, in order (identity in fp32 on the first shape only)."""
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
