"""Target-written prompts: the target writes the user questions itself, then answers them.

The chat template is rendered up to where the user's text starts and the target continues from
there (sampled); questions are deduplicated and reported with their diversity.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict
from pathlib import Path

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DistillConfig
from draftheads.data.chat import user_turn_prefix
from draftheads.data.distill.generate import (
    DecodeFn,
    GenerateFn,
    GenParams,
    Runner,
    decoder_generate,
    stock,
)
from draftheads.data.distill.shards import PROMPTS
from draftheads.data.prompts import PromptRow
from draftheads.heads.files import atomic_write


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def diversity(texts: list[str]) -> dict:
    """Distinct-n (unique n-grams / all n-grams, over words) and the spread of lengths in words."""
    words = [re.findall(r"\w+|[^\w\s]", t.lower()) for t in texts]
    stats: dict = {"prompts": len(texts)}
    for n in (1, 2, 3):
        grams = [tuple(w[i : i + n]) for w in words for i in range(len(w) - n + 1)]
        stats[f"distinct_{n}"] = round(len(set(grams)) / max(len(grams), 1), 4)
    lengths = sorted(len(w) for w in words) or [0]
    stats["length_words"] = {
        "min": lengths[0],
        "median": statistics.median(lengths),
        "p90": lengths[int(0.9 * (len(lengths) - 1))],
        "max": lengths[-1],
        "stdev": round(statistics.pstdev(lengths), 2),
    }
    return stats


def self_prompts(
    model,
    tokenizer,
    cfg: DistillConfig,
    generate: GenerateFn | None = None,
    show_progress: bool = True,
    decode: DecodeFn | None = None,
    runner: Runner = stock,
) -> tuple[list[PromptRow], dict]:
    """Let the target write ``cfg.self_prompts`` distinct user questions (cached in ``prompts.jsonl``).

    The chat template is rendered up to where the user's text starts and the target continues
    from there, sampled with the ``prompt_*`` settings; a question ends at the end-of-turn
    token. Questions cut off by ``prompt_max_new_tokens``, shorter than three words, or
    duplicates (case and whitespace folded) are dropped; generation stops after
    ``4 * self_prompts`` candidates.
    """
    from tqdm.auto import tqdm

    out = Path(cfg.out_dir)
    cached = out / PROMPTS
    if cached.is_file():
        rows = [PromptRow(**json.loads(line)) for line in cached.read_text().splitlines() if line.strip()]
        return rows, json.loads((out / "prompts.stats.json").read_text())
    generate = generate or decoder_generate(model, tokenizer, decode)
    params = GenParams(cfg.prompt_max_new_tokens, cfg.prompt_temperature, cfg.prompt_top_p)
    prefix = tokenizer(user_turn_prefix(tokenizer), add_special_tokens=False)["input_ids"]
    seen: set[str] = set()
    kept: list[str] = []
    counts = {"candidates": 0, "duplicates": 0, "cut_off": 0, "too_short": 0}
    b = 0
    bar = tqdm(total=cfg.self_prompts, unit="prompt", disable=not show_progress, desc="self-prompts")
    with bar, runner(model):
        while len(kept) < cfg.self_prompts and counts["candidates"] < 4 * cfg.self_prompts:
            texts, stopped = generate([prefix] * cfg.batch_size, params, cfg.seed + 10**6 + b)
            b += 1
            for ids, ok in zip(texts, stopped):
                counts["candidates"] += 1
                q = tokenizer.decode(ids, skip_special_tokens=True).strip()
                key = normalise(q)
                if not ok:
                    counts["cut_off"] += 1
                elif len(key.split()) < 3:
                    counts["too_short"] += 1
                elif key in seen:
                    counts["duplicates"] += 1
                elif len(kept) < cfg.self_prompts:
                    seen.add(key)
                    kept.append(q)
                    bar.update(1)
    if not kept:
        raise UserError(
            "the target wrote no usable prompts; raise data.distill.prompt_max_new_tokens or temperature"
        )
    rows = [PromptRow(f"self-{i:06d}", "self", [q]) for i, q in enumerate(kept)]
    stats = {**diversity(kept), **counts}
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompts.stats.json").write_text(json.dumps(stats, indent=1))
    text = "".join(json.dumps(asdict(r), ensure_ascii=False) + "\n" for r in rows)
    atomic_write(cached, lambda tmp: tmp.write_text(text))
    return rows, stats
