"""Recipe rows at the bench's full data: ``bench.variants`` trains rows (names of
:data:`~bench.lab.ablation_rows.ABLATIONS`) on the main drafters' own data and passes (the
teacher-forced cache, plus the distilled answers when there are any) and measures each drafter
only, and once more with the decoder's defaults as the main drafters' held-out τ is: a lever that
pays only with more data, such as a drafter's depth, shows at the bench's size, beside the main
drafter it would replace. Each row is cached in ``bench.out_dir/variants/<row>``, resumable as
every training stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftheads.bench import teacher_stages
from draftheads.bench.drafter_only import MainData, heldout_stage, stage_alone
from draftheads.bench.stages import log
from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig

from .ablation_rows import DRAFTER_ONLY
from .rows import ablation_rows, drafter_row, row_settings, split_overrides


def stage_defaults(cfg: BenchArgs, b: BenchConfig, target, tok, heads: Path) -> dict[str, Any]:
    """τ of the drafter at ``heads`` on the held-out prompts with the decoder's defaults (lookup
    branch, cost-aware planner), as the main drafters' held-out τ is. Cached in
    ``heads/defaults-tau``."""
    return heldout_stage(cfg, b, target, tok, heads, "defaults-tau", {})


def check_variants(b: BenchConfig) -> None:
    """Refuse, before the first stage, variant rows that cannot train on the main data: unknown
    names, rows of a drafter that trains in memory (Medusa, on ``bench.medusa_tokens``), rows on
    other data, rows that only decode differently, and any row without teacher-forced data to stream."""
    if not b.variants:
        return
    rows = ablation_rows(list(b.variants), "bench.variants")  # unknown names: refused there
    if not b.teacher_tokens:
        raise UserError(
            "bench.variants train on the main drafters' streamed data, which needs teacher-forced text; "
            "set bench.teacher_tokens (e.g. 500000) or leave bench.variants empty"
        )
    for name, extra in rows.items():
        trained, decode = split_overrides(extra)
        _, data, _ = row_settings(trained)
        d = teacher_stages.row_drafter(trained)
        why = (
            f"is a {d.name} row ({d.name} trains in memory" + (f", on bench.{d.tokens})" if d.tokens else ")")
            if not d.offline
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
    for name, extra in ablation_rows(list(b.variants)).items():
        trained, _, passes = row_settings(split_overrides(extra)[0])
        # a row named "x drafter only" trains and is stored as x
        heads = Path(b.out_dir) / "variants" / drafter_row(name).replace(" ", "-")
        info = teacher_stages.train_on(
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
