"""What a drafter itself learnt at the bench's full data: held-out τ with its own tree alone.

``bench.drafter_only`` decodes every main drafter once more with no lookup branch and no
cost-aware planner, so that τ moves with the drafter alone. The data the streamed main drafters
train on (:func:`main_data`) lives here too: the rows a maintainer trains on the same data (the
lab's variants, run from the repository) read it the same way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple

from draftheads.bench import teacher_stages
from draftheads.bench.stages import done, log, mark_done
from draftheads.conf.commands.args import BenchArgs, DemoArgs
from draftheads.conf.schema import BenchConfig

# the drafter's own tree verified at every step: no lookup branch, no cost-aware pruning or
# skipping (the decode settings; :func:`decode_overrides` writes them as overrides)
ALONE = {"lookup": False, "cost_aware": False}


class MainData(NamedTuple):
    """What the streamed main drafters train on."""

    source: Path  # the teacher cache, or the view that adds the distilled answers
    tokens: int  # answer tokens in one pass over it
    epochs: float  # passes
    note: dict[str, Any]  # what the view adds (distilled tokens, repeats); empty without one


def decode_overrides(decode: dict[str, bool]) -> list[str]:
    """Decode settings as the ``decode.key=value`` overrides a row (or a stage) passes."""
    return [f"decode.{key}={str(value).lower()}" for key, value in decode.items()]


def stage_alone(cfg: BenchArgs | DemoArgs, b: BenchConfig, target, tok, heads: Path) -> dict[str, Any]:
    """τ of the drafter at ``heads`` on the held-out prompts, decoded with its own tree alone (no
    lookup branch, no planner) as the ablation rows' "drafter only" τ is: what the drafter
    itself learnt. Cached in ``heads/drafter-only`` with its minutes."""
    return heldout_stage(cfg, b, target, tok, heads, "drafter-only", ALONE)


def heldout_stage(cfg, b: BenchConfig, target, tok, heads: Path, name: str, decode: dict[str, bool]) -> dict:
    """The held-out τ of ``heads`` decoded with the ``decode`` settings over the configured ones,
    cached in ``heads/<name>`` with its minutes."""
    folder = heads / name
    settings = {"prompts": b.eval_prompts, "new_tokens": b.eval_new_tokens, "decode": decode}
    if done(folder, settings):
        return json.loads((folder / "tau.json").read_text())
    (folder / "tau.json").unlink(missing_ok=True)  # a record of an interrupted run
    log(f"held-out τ of {heads.name}, " + ("drafter only" if decode else "with the decoder's defaults"))
    t0 = time.perf_counter()
    tau = teacher_stages.heldout_tau(cfg, b, target, tok, heads, decode_overrides(decode), folder)
    mark_done(folder, {"seconds": time.perf_counter() - t0}, settings)
    return tau


def main_data(b: BenchConfig, teacher: Path, distilled: Path | None) -> MainData:
    """What the streamed main drafters (``BenchDrafter.streamed``) train on with teacher-forced data: the
    teacher cache for ``bench.scaling_compute`` answer-token passes over it, read through a view
    that adds the distilled answers when there are any (the same passes over the view)."""
    tokens = json.loads((teacher / ".done").read_text())["answer_tokens"]
    epochs = b.scaling_compute / max(tokens, 1)
    if distilled is None:
        return MainData(teacher, tokens, epochs, {})
    source, note = teacher_stages.mixture(b, teacher, distilled)
    return MainData(source, tokens + note["distilled_tokens"], epochs, note)
