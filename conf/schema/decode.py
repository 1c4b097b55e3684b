"""Typed configs of decoding and evaluation (Hydra groups ``decode/`` and ``eval/``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeConfig:
    """Speculative decoding (``draftheads generate``, ``draftheads tree``, the Python generator).

    ``tree``: ``auto`` (``tree.json`` beside the heads if present; else EAGLE-2 dynamic trees for
    EAGLE when ``dynamic``, or a default tree of ``total_tokens`` for Medusa), ``chain``/``chainN``,
    a JSON choices list such as ``[[0],[1],[0,0]]``, or a path to a tree.json.
    EAGLE-2 dynamic trees: expand ``top_k_draft`` nodes per level for ``depth`` levels, then keep
    the ``total_tokens`` (root included) most confident. ``typical`` opts into Medusa's typical
    acceptance: faster under sampling, NOT lossless.

    ``backend``: how the target's and the drafter's linear layers run: ``auto`` (``onednn`` on a
    CPU that has it, ``eager`` elsewhere), ``eager`` (stock PyTorch), ``onednn`` (pre-packed
    oneDNN weights, CPU), ``cuda-graphs`` (static shapes captured as CUDA graphs, GPU).
    ``cost_aware``: each step verifies only as many drafted tokens as pay for themselves, judged
    by the backend's measured verify-cost curve (cached under ``cost_cache``) and the drafts'
    confidence. ``lookup``: add a branch of n-gram matches from the prompt and the text so far
    (prompt lookup) to every tree, of up to ``lookup_tokens`` tokens matched on the last
    ``lookup_ngram`` .. 1 tokens.
    """

    max_new_tokens: int = 128
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    tree: str = "auto"
    dynamic: bool = True
    top_k_draft: int = 4
    depth: int = 4
    total_tokens: int = 8
    typical: bool = False
    typical_epsilon: float = 0.09
    typical_delta: float = 0.3
    stop: list[str] | None = None
    batch_size: int = 1
    seed: int = 0
    chat: bool = True
    # draftheads tree: size (nodes incl. root) or 0 = pick from the measured cost curve
    tree_size: int = 8
    tree_max_size: int = 64
    tree_topk: int = 10
    tree_prompts: int = 16
    tree_new_tokens: int = 48
    backend: str = "auto"
    cost_aware: bool = True
    cost_cache: str | None = None
    lookup: bool = True
    lookup_tokens: int = 6
    lookup_ngram: int = 3


@dataclass
class EvalConfig:
    """``draftheads eval``: which prompts, which baselines, where the report goes.

    ``prompts``: ``heldout`` (embedded held-out prompts), ``humaneval``, ``spec_bench``,
    ``gsm8k_test``, or any path / dataset id the data pipeline reads. ``baselines``: ``pld``
    (transformers' prompt lookup decoding); ``assisted`` is added when ``assistant_model`` is set.
    """

    prompts: str = "heldout"
    output_dir: str = "outputs/eval"
    max_prompts: int | None = None
    baselines: list[str] | None = None
    assistant_model: str | None = None
    warmup: int = 1
