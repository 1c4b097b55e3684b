"""The study's scaling curve on distilled data: tau on held-out prompts against training tokens.

One drafter per point, trained on the first ``n`` cached answer tokens with steps in proportion,
then decoded on the held-out prompts; the main drafter (trained on every cached token) is the
curve's last point. With teacher-forced data the curve is drawn at equal compute instead
(:func:`bench.lab.study.stage_scaling`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftheads.bench.stages import answer_tokens, drafter_rows, eval_prompts, log
from draftheads.bench.train_stages import stage_train
from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.bench_drafters import bench_drafter

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# the fewest steps a scaling point trains, however few its tokens (a toy run may lower it)
MIN_STEPS = 50


def stage_scaling(
    cfg: BenchArgs,
    b: BenchConfig,
    target: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    cache: Path,
    name: str,
) -> list[dict]:
    """One point per ``bench.scaling_tokens`` entry for the bench drafter ``name``: answer tokens,
    steps and held-out tau."""
    from draftheads.decode import SpeculativeGenerator
    from draftheads.decode.prompting import encode_prompt
    from draftheads.heads import Drafter
    from draftheads.heads.target.fingerprint import fingerprint

    H, L = target.config.hidden_size, fingerprint(target).num_layers
    prompts = eval_prompts("heldout", b, tok)
    points = []
    for n in b.scaling_tokens:
        out = Path(b.out_dir) / "scaling" / f"{name}-{n}"
        result = out / "tau.json"
        if not result.is_file():
            rows = drafter_rows(bench_drafter(name), cache, H, L, max_tokens=n)
            have = answer_tokens(rows)
            if have < 0.9 * n:
                log(f"scaling: only {have} answer tokens cached, fewer than {n}; skipping this point")
                continue
            steps = max(MIN_STEPS, math.ceil(have / 10_000 * b.scaling_steps_per_10k_tokens))
            stage_train(cfg, b, name, rows, steps, out / "drafter")
            del rows
            drafter = Drafter.from_pretrained(out / "drafter", target=target, tokenizer=tok)
            gen = SpeculativeGenerator(target, drafter, tokenizer=tok, config=cfg.decode)
            accepted, steps_n = 0, 0
            for p in prompts:
                ids = encode_prompt(tok, p.turns[0]).to(next(target.parameters()).device)
                gen.generate(ids, max_new_tokens=b.eval_new_tokens)
                accepted += sum(gen.last_stats.accepted_lengths)
                steps_n += len(gen.last_stats.accepted_lengths)
            result.write_text(
                json.dumps(
                    {
                        "answer_tokens": have,
                        "steps": steps,
                        "tau": accepted / max(steps_n, 1),
                        "prompts": len(prompts),
                    }
                )
                + "\n"
            )
        points.append(json.loads(result.read_text()))
        log(f"scaling {name}: {points[-1]['answer_tokens']} tokens -> tau {points[-1]['tau']:.2f}")
    return points


def main_point(results: dict[str, Any], name: str) -> list[dict]:
    """The main drafter as the curve's last point: it was trained on every cached token and
    evaluated on the same held-out prompts and length as the scaling points."""
    report = results["drafters"].get(name, {}).get("heldout")
    if report is None:
        return []
    train = results["train"][name]
    return [
        {
            "answer_tokens": train["answer_tokens"],
            "steps": train.get("steps"),
            "epochs": train.get("epochs"),
            "seconds": train.get("seconds"),
            "tau": report["tau"],
            "prompts": report["num_prompts"],
        }
    ]
