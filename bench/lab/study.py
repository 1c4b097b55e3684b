"""The maintainers' study beside a bench run: τ at equal compute for more distinct data against
more epochs (scaling), one row per recipe switch at equal data (ablations), and recipe rows at
the main drafters' own data (variants). It is not installed; run it from the top of a checkout::

    python -m bench.lab.study 'bench.scaling_tokens=[68000,150000]' 'bench.ablations=[all]'

Its arguments are ``draftheads bench``'s overrides. The installed pipeline runs every main stage
(cached under ``bench.out_dir``, so a study rerun adds only its rows) and hands this module's
:class:`Study` the loaded target and caches; the results join the same ``bench.docs`` page.

Subsets of the teacher-forced cache are *views*: a folder whose manifest lists the first shards of
the full cache (rows are interleaved across components, so every prefix is a balanced mixture and
the smaller subsets are nested in the larger ones). Nothing is copied.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from draftheads.bench import teacher_stages
from draftheads.bench.extension import STUDY_COMMAND, MainRun, Rows
from draftheads.bench.pipeline import bench, pipeline
from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.bench_drafters import row_base

from . import scaling, variants
from .ablation_rows import ABLATIONS
from .rows import (
    ablation_rows,
    cached_rows,
    check_ablations,
    drafter_row,
    resolve_refs,
    row_overrides,
    row_settings,
    split_overrides,
    with_refs,
)


def cache_view(cache: Path, out: Path, max_tokens: int) -> int:
    """A cache folder reading the first shards of ``cache`` up to about ``max_tokens`` answer
    tokens (at least one shard); returns its answer tokens."""
    from draftheads.data.cache.manifest import read_manifest
    from draftheads.data.cache.views import write_view

    m = read_manifest(cache)
    per_shard = json.loads((cache / teacher_stages.ANSWER_TOKENS).read_text())
    k, tokens = 0, 0
    while k < len(per_shard) and (k == 0 or tokens + per_shard[k] / 2 <= max_tokens):
        tokens += per_shard[k]
        k += 1
    write_view(out, m, [(cache, m["shards"][:k])], num_loss_tokens=tokens)
    return tokens


def point(cfg, b, target, tok, cache: Path, folder: Path, tokens: int, compute: int,
          extra=(), decode=(), tau_in=None) -> dict[str, Any]:  # fmt: skip
    """Train in ``folder`` on the first ``tokens`` answer tokens of ``cache`` for ``compute``
    answer-token passes (epochs = compute / tokens), then τ on held-out prompts, decoded with
    ``decode`` overrides (recorded in ``tau_in``, by default ``folder``)."""
    have = cache_view(cache, folder / "cache", tokens)
    epochs = compute / max(have, 1)
    info = teacher_stages.train_on(
        cfg, b, target, folder / "cache", folder / "drafter", have, epochs, list(extra)
    )
    tau = teacher_stages.heldout_tau(cfg, b, target, tok, folder / "drafter", decode, tau_in)
    return {**info, **tau, "compute": compute}


def stage_scaling(cfg: BenchArgs, b: BenchConfig, target, tok, cache: Path) -> list[dict]:
    """τ at equal compute (``bench.scaling_compute`` answer-token passes) for each of
    ``bench.scaling_tokens`` distinct answer tokens: more data against more epochs."""
    from draftheads.bench.stages import log

    points = []
    for n in b.scaling_tokens:
        p = point(
            cfg,
            b,
            target,
            tok,
            cache,
            Path(b.out_dir) / "scaling" / f"{row_base().name}-{n}",
            n,
            b.scaling_compute,
        )
        log(f"scaling: {p['answer_tokens']} tokens x {p['epochs']:.2f} epochs -> tau {p['tau']:.2f}")
        points.append(p)
    return points


def stage_ablations(
    cfg: BenchArgs, b: BenchConfig, target, tok, cache: Path, regenerated: Path | None = None
) -> dict[str, dict]:
    """One row per recipe switch, all on ``bench.ablation_tokens`` answer tokens of the
    teacher-forced ``cache`` (or of the ``regenerated`` answers' cache, for a row that asks for
    them: equal data) and ``bench.ablation_epochs`` passes unless the row sets its own. A row
    that only decodes differently reuses the drafter of :func:`drafter_row`."""
    from draftheads.bench.stages import log

    rows = {}
    root = Path(b.out_dir) / "ablations"
    for name in with_refs(list(ablation_rows(list(b.ablations)))):
        folder = root / name.replace(" ", "-")
        trained, decode = split_overrides(resolve_refs(ABLATIONS[name], root))
        trained, data, epochs = row_settings(trained)
        source = regenerated if data == "regenerated" else cache
        compute = round(b.ablation_tokens * (epochs or b.ablation_epochs))
        trained_in = root / drafter_row(name).replace(" ", "-")
        rows[name] = point(
            cfg, b, target, tok, source, trained_in, b.ablation_tokens, compute, trained, decode, folder
        )
        rows[name]["data"] = data
        log(f"ablation {name}: tau {rows[name]['tau']:.2f}")
    return rows


class Study(Rows):
    """The study's rows for the installed pipeline: checked before its first stage, their layers
    in its caches, run after its main stages."""

    def check(self, b: BenchConfig) -> None:
        check_ablations(b)
        variants.check_variants(b)

    def overrides(self, b: BenchConfig) -> list[list[str]]:
        return row_overrides(cached_rows(b))

    def run(self, main: MainRun) -> dict[str, Any]:
        cfg, b, target, tok, cache, distilled, data, lead, results = main
        found: dict[str, Any] = {}
        if b.teacher_tokens:
            points = stage_scaling(cfg, b, target, tok, cache)
            # the main drafter is a point of the equal-compute curve (trained on the points' recipe,
            # the row base's) unless distilled data was added
            main_point = lead == row_base().name and distilled is None
            found["scaling"] = points + (scaling.main_point(results, lead) if main_point else [])
            found["ablations"] = stage_ablations(cfg, b, target, tok, cache, distilled)
        elif lead and b.scaling_tokens:
            points = scaling.stage_scaling(cfg, b, target, tok, cache, lead)
            found["scaling"] = points + scaling.main_point(results, lead)
        if data and b.variants:
            found["variants"] = variants.stage_variants(cfg, b, target, tok, data)
        return found

    def command(self) -> str:
        return shlex.join([*shlex.split(STUDY_COMMAND), *sys.argv[1:]])


STUDY = Study()


def run(cfg: BenchArgs, b: BenchConfig) -> dict[str, Any]:
    """The installed pipeline with the study's rows: what a study's docs page is written from."""
    return pipeline(cfg, b, STUDY)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.lab.study OVERRIDES``: ``draftheads bench`` with the study's rows."""
    from draftheads.conf.cli import parse

    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print(__doc__)
        return 0
    try:
        bench(parse(["bench", *args]).args, STUDY)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
