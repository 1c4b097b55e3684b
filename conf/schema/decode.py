"""Typed configs of decoding and evaluation (Hydra groups ``decode/`` and ``eval/``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.conf.schema.checks import BACKENDS, at_least, finite, is_hub_id, one_of, probability
from draftheads.conf.schema.data import check_fields, check_format

BASELINES = ("pld", "assisted")
PROMPT_SETS = (
    "heldout",
    "humaneval",
    "long",
    "copy",
    "spec_bench",
    "gsm8k_test",
    "gsm8k_train",
    "codealpaca",
)
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
MAX_LOOKUP_TOKENS = 64  # the longest lookup branch: the planner verifies a few nodes on a CPU
MAX_LOOKUP_NGRAM = 8


def check_prompt_source(key: str, source: str) -> None:
    """``source`` is a named prompt set, ``embedded[:component]``, an existing path or a hub id.

    A bare word that is none of these (a typo'd set name) is refused with the valid names
    instead of being looked up on the Hub; a path-like name that does not exist is refused too.
    """
    if source in PROMPT_SETS or source == "embedded" or source.startswith("embedded:"):
        return
    if not str(source).strip():  # Path("") is the working folder, which exists
        raise UserError(f"{key} is empty; give a prompt set ({', '.join(PROMPT_SETS)}), a file, or ORG/NAME")
    p = Path(source).expanduser()
    if p.exists():
        return
    if source.startswith((".", "/", "~")) or p.suffix in DATA_SUFFIXES:
        raise UserError(f"{key}={source} does not exist; check the path")
    if not is_hub_id(source):
        raise UserError(
            f"{key}={source} is not a prompt set, a file or folder, or a dataset id ORG/NAME; "
            f"use one of {', '.join(PROMPT_SETS)}, embedded, a path, or ORG/NAME"
        )


def check_temperatures(key: str, temperatures: list) -> None:
    """Every temperature of ``key`` is a finite number above 0 (sampling needs one)."""
    for t in temperatures:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise UserError(
                f"{key} has {t!r}; use temperatures > 0 (e.g. {key}=[0.7,1.0]), or {key}=[] for greedy alone"
            )


def check_assistant_model(key: str, name: str | None) -> None:
    """``name`` is a model folder (one holding ``config.json``) or a hub id ``ORG/NAME``: a path
    that does not exist, a folder without a model, and a bare word are refused before the target
    loads, instead of surfacing as the Hub's error about repository ids."""
    if name is None:
        return
    p = Path(name).expanduser()
    fix = "give a model folder holding config.json, or a hub model id ORG/NAME"
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise UserError(f"{key}={name} is a folder without config.json, so it holds no model; {fix}")
        return
    if p.exists():
        raise UserError(f"{key}={name} is a file, not a model folder; {fix}")
    if name.startswith((".", "/", "~")) or not is_hub_id(name):
        raise UserError(f"{key}={name}: no folder {p.absolute()} and not a hub id; {fix}")


TREE_WORDS = "one of auto, chain, chainN, a JSON list like [[0],[1],[0,0]] or a tree.json path"


def choices_problem(choices: object) -> str | None:
    """Why a JSON ``decode.tree`` is no tree of rank paths (each a non-empty list of ranks >= 0
    whose parent is listed too, none twice), or None."""
    if not isinstance(choices, list) or not choices:
        return "is not a non-empty list of rank paths"
    paths = []
    for c in choices:
        if (
            not isinstance(c, list)
            or not c
            or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in c)
        ):
            return f"has {c}, which is not a non-empty list of ranks >= 0"
        paths.append(tuple(c))
    if len(set(paths)) != len(paths):
        return "lists a path twice"
    missing = next((p for p in paths if len(p) > 1 and p[:-1] not in set(paths)), None)
    return None if missing is None else f"has {list(missing)} without its parent {list(missing[:-1])}"


def tree_spec_problem(spec: str) -> str | None:
    """Why ``decode.tree`` names no tree, or None; a file is only looked for (decoding reads it)."""
    if spec in ("auto", ""):
        return None
    if spec.startswith("chain"):
        n = spec[len("chain") :]
        return None if n == "" or (n.isdigit() and int(n) >= 1) else "is unknown"
    if spec.lstrip().startswith("["):
        try:
            return choices_problem(json.loads(spec))
        except json.JSONDecodeError:
            return "is not valid JSON"
    return None if Path(spec).expanduser().is_file() else "names no tree and no file"


@dataclass
class DecodeConfig:
    """Speculative decoding (``draftheads generate``, ``draftheads tree``, the Python generator).

    ``do_sample``, ``temperature``, ``top_p``, ``top_k`` left unset (None) follow the target's
    generation config, as ``target.generate`` does (transformers' defaults: greedy, top-k 50).
    ``tree``: ``auto`` (``tree.json`` beside the heads if present; else, when ``dynamic``, dynamic
    trees (Li et al., 2024), or DDTree for a block drafter; for heads that index a static tree by
    depth, a default tree of ``total_tokens``), ``chain``/``chainN`` (for a block drafter ``chain``
    is the whole block), a JSON choices list such as ``[[0],[1],[0,0]]``, or a path to a tree.json.
    Dynamic trees (Li et al., 2024): expand ``top_k_draft`` nodes per level for ``depth`` levels
    (with ``cost_aware``, fewer when the last ones did not pay), then keep the ``total_tokens``
    (root included) most confident. DDTree (one pass of a block drafter): the ``total_tokens`` - 1
    likeliest paths over each block position's ``top_k_draft`` candidates, as deep as the block.
    ``typical`` opts into typical acceptance (Cai et al., 2024): faster under sampling, NOT lossless.

    ``backend``: how the target's and the drafter's linear layers run: ``auto`` (on a float32 CPU
    with oneDNN, ``eager`` or ``onednn``, whichever was measured faster for the target and for the
    drafter here; ``eager`` elsewhere), ``eager`` (stock PyTorch), ``onednn`` (pre-packed
    oneDNN weights, CPU), ``cuda-graphs`` (static shapes captured as CUDA graphs, GPU).
    ``cost_aware``: each step verifies only as many drafted tokens as pay for themselves, judged
    by the backend's measured verify-cost curve (cached under ``cost_cache``) and the drafts'
    confidence. ``lookup``: add a branch of n-gram matches from the prompt and the text so far
    (prompt lookup) to every tree, of up to ``lookup_tokens`` tokens matched on the last
    ``lookup_ngram`` .. 1 tokens.
    """

    max_new_tokens: int = 128
    # None: the target's generation config decides (transformers' defaults: greedy; top_k 50)
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
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

    def __post_init__(self) -> None:
        """Refuse values no decoder can use, before a model is loaded or a file written (a
        ``DecodeConfig`` built in Python too: a NaN or infinity first)."""
        finite(self, "decode.", DecodeConfig)
        if self.top_p is not None:
            probability("decode.top_p", self.top_p, 0.95)
        at_least("decode.top_k", self.top_k, 0, "0 (no top-k cut)")
        if self.temperature is not None and self.temperature <= 0:
            raise UserError(
                f"decode.temperature={self.temperature} is out of range; use a value > 0 "
                "(e.g. decode.temperature=0.7); greedy decoding is decode.do_sample=false"
            )
        if self.do_sample is False:
            for key in ("temperature", "top_p", "top_k"):
                if getattr(self, key) is not None:
                    raise UserError(
                        f"decode.{key}={getattr(self, key)} shapes sampling, but decode.do_sample=false "
                        f"decodes greedily and would ignore it; set decode.do_sample=true, or drop decode.{key}"
                    )
        if self.typical and not self.do_sample:
            raise UserError(
                "decode.typical=true applies only to sampling (greedy decoding is already exact); "
                "set decode.do_sample=true or drop decode.typical"
            )
        for key, low, example in (
            ("max_new_tokens", 1, 128),
            ("batch_size", 1, 1),
            ("tree_size", 0, "0 (pick from the cost curve)"),
            ("tree_max_size", 1, 64),
            ("tree_topk", 1, 10),
            ("tree_prompts", 1, 16),
            ("tree_new_tokens", 1, 48),
            ("top_k_draft", 1, 4),
            ("depth", 1, 4),
            ("total_tokens", 2, 8),
            ("lookup_tokens", 0, 6),
            ("lookup_ngram", 1, 3),
        ):
            at_least(f"decode.{key}", getattr(self, key), low, example)
        for key, high, why in (
            ("lookup_tokens", MAX_LOOKUP_TOKENS, "a longer branch only adds nodes the planner prunes"),
            ("lookup_ngram", MAX_LOOKUP_NGRAM, "longer matches are rarer and cost more to index"),
        ):
            if getattr(self, key) > high:
                raise UserError(
                    f"decode.{key}={getattr(self, key)} is out of range; use at most {high} ({why}), "
                    f"e.g. decode.{key}={getattr(DecodeConfig, key)}"
                )
        at_least("decode.typical_epsilon", self.typical_epsilon, 0, 0.09)
        at_least("decode.typical_delta", self.typical_delta, 0, 0.3)
        one_of("decode.backend", self.backend, BACKENDS)
        problem = tree_spec_problem(str(self.tree))
        if problem:
            raise UserError(f"decode.tree={self.tree} {problem}; use {TREE_WORDS}")
        if any(not str(s) for s in self.stop or []):
            raise UserError(
                f"decode.stop={list(self.stop)} has an empty string, which would stop at once; "
                "list only non-empty stop strings, e.g. decode.stop=['\\n\\n']"
            )


@dataclass
class EvalConfig:
    """``draftheads eval``: which prompts, which baselines, where the report goes.

    ``prompts``: ``heldout`` (embedded held-out prompts), ``humaneval``, ``long`` (1-2k token
    prompts over standard-library source), ``copy`` (1-2k token prompts whose answers copy from
    them: summaries, quotes, code edits), ``spec_bench``,
    ``gsm8k_test``, or any path / dataset id the data pipeline reads; ``format`` and ``fields``
    read a file whose columns have other names (as ``data.format`` / ``data.fields`` do, e.g.
    ``eval.fields.prompt=question``). ``per_category``: keep only the first N prompts of every
    category (e.g. one Spec-Bench question per category), before ``max_prompts``.
    ``baselines``: ``pld`` (transformers' prompt lookup decoding); ``assisted`` is added when
    ``assistant_model`` is set. ``temperatures``: speed and τ under sampling at each of them,
    beside greedy, on each prompt's first turn (``[]``: greedy alone). ``output_dir`` (``eval.out_dir``) unset: a folder of the
    drafter's own, ``<heads>/eval-<prompts>`` (``outputs/eval/<name>-<prompts>`` for a hub id
    or ``heads=none``), so one drafter's report never replaces another's.
    """

    prompts: str = "heldout"
    output_dir: str | None = None
    format: str = "auto"
    fields: dict[str, str] = field(default_factory=dict)
    max_prompts: int | None = None
    per_category: int | None = None
    baselines: list[str] | None = None
    assistant_model: str | None = None
    warmup: int = 1
    temperatures: list[float] = field(default_factory=lambda: [0.7, 1.0])

    def __post_init__(self) -> None:
        """Refuse prompt counts and baselines the evaluation cannot run, before it starts."""
        check_prompt_source("eval.prompts", self.prompts)
        check_format("eval.format", self.format)
        check_fields("eval.fields", self.fields)
        at_least("eval.max_prompts", self.max_prompts, 1, 20)
        at_least("eval.per_category", self.per_category, 1, 1)
        at_least("eval.warmup", self.warmup, 0, 1)
        check_temperatures("eval.temperatures", self.temperatures)
        for name in self.baselines or []:
            one_of("eval.baselines", name, BASELINES)
        twice = sorted({b for b in self.baselines or [] if list(self.baselines).count(b) > 1})
        if twice:
            once = ",".join(dict.fromkeys(self.baselines))
            raise UserError(
                f"eval.baselines={list(self.baselines)} names {', '.join(twice)} twice; "
                f"list each baseline once, e.g. eval.baselines=[{once}]"
            )
        check_assistant_model("eval.assistant_model", self.assistant_model)
        if "assisted" in (self.baselines or []) and not self.assistant_model:
            raise UserError(
                "eval.baselines has assisted but no eval.assistant_model; set eval.assistant_model=PATH_OR_ID"
            )
