"""What a drafter itself learnt at the bench's full data: held-out τ with its own tree alone.

``bench.drafter_only`` decodes every main drafter once more with no lookup branch and no
cost-aware planner, so that τ moves with the drafter alone. ``bench.variants`` trains recipe rows
(names of :data:`~draftheads.bench.ablation_rows.ABLATIONS`) on the main drafters' own data and
passes (the teacher-forced cache, plus the distilled answers when there are any) and measures
each the same way, and once more with the decoder's defaults as the main drafters' held-out τ
is: a lever that pays only with more data, such as a drafter's depth, shows at the bench's size,
beside the main drafter it would replace. Each row is cached in
``bench.out_dir/variants/<row>``, resumable as every training stage.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple

from draftheads.bench import study
from draftheads.bench.ablation_rows import ALONE, DRAFTER_ONLY, decode_overrides
from draftheads.bench.stages import done, log, mark_done
from draftheads.conf.commands.args import BenchArgs, DemoArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig


class MainData(NamedTuple):
    """What the streamed main drafters train on."""

    source: Path  # the teacher cache, or the view that adds the distilled answers
    tokens: int  # answer tokens in one pass over it
    epochs: float  # passes
    note: dict[str, Any]  # what the view adds (distilled tokens, repeats); empty without one


def stage_alone(cfg: BenchArgs | DemoArgs, b: BenchConfig, target, tok, heads: Path) -> dict[str, Any]:
    """τ of the drafter at ``heads`` on the held-out prompts, decoded with its own tree alone (no
    lookup branch, no planner) as the ablation rows' "drafter only" τ is: what the drafter
    itself learnt. Cached in ``heads/drafter-only`` with its minutes."""
    return heldout_stage(cfg, b, target, tok, heads, "drafter-only", ALONE)


def stage_defaults(cfg: BenchArgs, b: BenchConfig, target, tok, heads: Path) -> dict[str, Any]:
    """τ of the drafter at ``heads`` on the held-out prompts with the decoder's defaults (lookup
    branch, cost-aware planner), as the main drafters' held-out τ is. Cached in
    ``heads/defaults-tau``."""
    return heldout_stage(cfg, b, target, tok, heads, "defaults-tau", {})


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
    tau = study.heldout_tau(cfg, b, target, tok, heads, decode_overrides(decode), folder)
    mark_done(folder, {"seconds": time.perf_counter() - t0}, settings)
    return tau


def main_data(b: BenchConfig, teacher: Path, distilled: Path | None) -> MainData:
    """What the streamed main drafters (EAGLE-3, DFlash) train on with teacher-forced data: the
    teacher cache for ``bench.scaling_compute`` answer-token passes over it, read through a view
    that adds the distilled answers when there are any (the same passes over the view)."""
    tokens = json.loads((teacher / ".done").read_text())["answer_tokens"]
    epochs = b.scaling_compute / max(tokens, 1)
    if distilled is None:
        return MainData(teacher, tokens, epochs, {})
    source, note = study.mixture(b, teacher, distilled)
    return MainData(source, tokens + note["distilled_tokens"], epochs, note)


def check_variants(b: BenchConfig) -> None:
    """Refuse, before the first stage, variant rows that cannot train on the main data: unknown
    names, Medusa rows (Medusa trains on ``bench.medusa_tokens``), rows on other data, rows that
    only decode differently, and any row without teacher-forced data to stream."""
    if not b.variants:
        return
    rows = study.ablation_rows(list(b.variants), "bench.variants")  # unknown names: refused there
    if not b.teacher_tokens:
        raise UserError(
            "bench.variants train on the main drafters' streamed data, which needs teacher-forced text; "
            "set bench.teacher_tokens (e.g. 500000) or leave bench.variants empty"
        )
    for name, extra in rows.items():
        trained, decode = study.split_overrides(extra)
        _, data, _ = study.row_settings(trained)
        why = (
            "is a Medusa row (Medusa trains on bench.medusa_tokens)"
            if any(o.startswith("draft=medusa") for o in trained)
            else f"trains on the {data} answers alone"
            if data != "teacher"
            else "decodes differently (variants are measured drafter only)"
            if set(decode) - set(DRAFTER_ONLY)
            else ""
        )
        if why:
            raise UserError(
                f"bench.variants row {name!r} does not train on the main data: it {why}; name an "
                "EAGLE-3 or DFlash training row, e.g. 'dflash 2 layers'"
            )


def stage_variants(cfg: BenchArgs, b: BenchConfig, target, tok, data: MainData) -> dict[str, dict]:
    """Each ``bench.variants`` row trained on the main data (its ``bench.epochs`` times the main
    passes), then its held-out τ drafter only: ``{row: training record + τ}``."""
    source, tokens, epochs, note = data
    rows = {}
    for name, extra in study.ablation_rows(list(b.variants)).items():
        trained, _, passes = study.row_settings(study.split_overrides(extra)[0])
        # a row named "x drafter only" trains and is stored as x
        heads = Path(b.out_dir) / "variants" / study.drafter_row(name).replace(" ", "-")
        info = study.train_on(
            cfg, b, target, source, heads, tokens, epochs * (passes or 1), trained, note=note
        )
        record = {k: v for k, v in info.items() if k != "settings"}
        rows[name] = {**record, "data": "teacher + distilled" if note else "teacher"}
        rows[name].update(stage_alone(cfg, b, target, tok, heads))
        rows[name]["defaults"] = stage_defaults(cfg, b, target, tok, heads)
        log(
            f"variant {name}: tau {rows[name]['tau']:.2f} drafter only, {rows[name]['defaults']['tau']:.2f} with the defaults"
        )
    return rows
