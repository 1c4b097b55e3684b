"""What every benchmark stage shares: logging, done markers, configs, cached rows and prompts.

The pipeline's stage modules (``data_stages``, ``train_stages``, ``eval_stage``, ``scaling``)
and :mod:`draftheads.bench.study` all build on these, so none needs another's internals.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig, Config
from draftheads.conf.schema.bench_drafters import BenchDrafter, bench_drafter
from draftheads.conf.schema.flat_keys import nested_draft


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def done(path: Path, settings: dict[str, Any] | None = None) -> bool:
    """Whether the stage that writes ``path`` has finished. A stage finished under other
    ``settings`` (recorded by :func:`mark_done`) stops the run: reusing it would report figures
    for settings that were not run. Markers that record no settings are trusted."""
    marker = path / ".done"
    if not marker.is_file():
        return False
    made = json.loads(marker.read_text()).get("settings")
    if isinstance(made, dict) and isinstance(made.get("draft"), dict):
        made["draft"] = nested_draft(made["draft"])  # recorded flat by the last release
    want = json.loads(json.dumps(settings))
    if settings is not None and made is not None and made != want:
        if unrecorded := sorted(set(want) - set(made)):
            raise UserError(
                f"{path} was made by an earlier draftheads, which did not record its {', '.join(unrecorded)}; "
                f"delete {path} to redo that stage, or set bench.out_dir to a new folder"
            )
        made, want = flat(made), flat(want)
        # a setting added since the stage ran, left unset (null), is the behaviour it ran with
        keys = sorted(
            k
            for k in {*made, *want}
            if made.get(k) != want.get(k) and not (k not in made and want[k] is None)
        )
        if not keys:
            return True
        was = ", ".join(f"{k}={made.get(k)}" for k in keys)
        now = ", ".join(f"{k}={want.get(k)}" for k in keys)
        raise UserError(
            f"{path} was made with {was}, not {now}; delete {path} to redo that stage, "
            "or set bench.out_dir to a new folder"
        )
    return True


def flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as ``a.b=value`` keys, so that a refusal names the one value that differs."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def drafter_settings(tcfg: Config) -> dict[str, Any]:
    """The resolved drafter settings a training stage ran with, recorded in its marker beside its
    overrides: a changed default of the draft config retrains the stage (after a one-line
    refusal) instead of reusing a drafter made under the old one."""
    return asdict(tcfg.draft)


def mark_done(path: Path, info: dict[str, Any] | None = None, settings: dict[str, Any] | None = None) -> None:
    """Mark the stage that writes ``path`` finished, with what it measured (``info``) and the
    settings it ran under (checked by :func:`done` on a rerun)."""
    path.mkdir(parents=True, exist_ok=True)
    record = {**(info or {}), **({"settings": settings} if settings is not None else {})}
    (path / ".done").write_text(json.dumps(record) + "\n")


# overrides -> their typed config: the stages of one bench compose the same few configs again
# and again (every rerun, every ablation row's layers), a third of a second each
_COMPOSED: dict[tuple[str, ...], Config] = {}


def compose(overrides: list[str]) -> Config:
    """The typed root config for ``overrides`` (how a stage configures a training run); each
    call gets its own copy, composed once per process (the config files do not change)."""
    import copy

    from draftheads.conf.commands.compose import compose as compose_config

    key = tuple(overrides)
    if key not in _COMPOSED:
        _COMPOSED[key] = compose_config(overrides)[0]
    return copy.deepcopy(_COMPOSED[key])


def load_rows(
    cache_dir: Path, hidden: int, which: str, max_tokens: int | None = None, layers: list[int] | None = None
) -> list[dict]:
    """Rows for ``train(rows=...)``: features sliced to what the drafter reads, in fp32.

    ``which``: ``last`` (the final state, for a drafter that reads only the final state) or ``all``
    (every layer of the cache, the final state included); ``layers`` picks some of the cache's
    layers first (a drafter's own training layers, which need not include the final state).
    ``max_tokens`` keeps a fixed random subset of rows up to that many answer tokens.
    """
    from draftheads.data.cache.read import FeatureCache

    cache = FeatureCache(cache_dir, layers=layers, subset=layers is not None)
    order = list(range(len(cache)))
    random.Random(0).shuffle(order)
    rows, tokens = [], 0
    for i in order:
        r = cache[i]
        n = int(r["loss_mask"].sum())
        if max_tokens is not None and tokens + n > max_tokens and rows:
            break
        f = r["features"][:, -hidden:] if which == "last" else r["features"]
        rows.append({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"], "features": f.float()})
        tokens += n
    return rows


def answer_tokens(rows: list[dict]) -> int:
    return int(sum(int(r["loss_mask"].sum()) for r in rows))


# an evaluation interval no bench run reaches: the trainer evaluates at its last step only, so
# every drafter's simulated τ and per-position accuracy land in its metrics.jsonl and card
EVAL_AT_END = 10**9


def train_overrides(name: str, out: Path, steps: int) -> list[str]:
    """The bench recipe of the bench drafter ``name``: its selection, learning rate and recipe, then
    what every bench training run shares."""
    common = [
        f"train.output_dir={out}",
        f"train.max_steps={steps}",
        "logger=none",
        f"train.eval_every={EVAL_AT_END}",
        "train.save_every=0",
        "train.warmup_steps=20",
    ]
    d = bench_drafter(name)
    return [*d.draft, f"train.lr={d.lr}", *d.recipe, *common]


def drafter_rows(
    d: BenchDrafter, cache_dir: Path, hidden: int, num_layers: int, max_tokens: int | None = None
) -> list[dict]:
    """The rows ``d`` trains on in memory: the cached features it reads (:attr:`BenchDrafter.reads`)."""
    layers = d.draft_config().training_layers(num_layers) if d.reads == "own" else None
    return load_rows(cache_dir, hidden, "last" if d.reads == "last" else "all", max_tokens, layers)


def target_group(cfg: BenchArgs) -> str:
    return f"tiny-{cfg.target.tiny}" if cfg.target.tiny else "smollm2"


def eval_prompts(name: str, b: BenchConfig, tok) -> list:
    """The prompts of one evaluation set; Spec-Bench takes the first N of every category."""
    from draftheads.data.prompts import load_prompts

    if name == "spec_bench":
        path = Path(b.shared_data) / "spec_bench" / "question.jsonl"
        if not path.is_file():
            return []
        rows = load_prompts(str(path), tokenizer=tok)
        per: dict[str, list] = {}
        for r in rows:
            per.setdefault(r.category, []).append(r)
        return [r for cat in sorted(per) for r in per[cat][: b.spec_bench_per_category]]
    if name == "gsm8k_test":
        path = Path(b.shared_data) / "gsm8k" / "test.jsonl"
        return load_prompts(str(path), max_prompts=b.eval_prompts, tokenizer=tok) if path.is_file() else []
    return load_prompts(name, max_prompts=b.eval_prompts, tokenizer=tok)
