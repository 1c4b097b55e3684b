"""How long each stage of the main bench run took, read back from the records the stages wrote.

The figures go to the docs page's stage table; reading them from the ``.done`` records (and
``tree.json``) rather than timing the run means a resumed run still reports every stage.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftheads.conf.schema import BenchConfig
from draftheads.conf.schema.bench_drafters import bench_drafter


def stage_minutes(b: BenchConfig) -> dict[str, float | None]:
    """Minutes each stage of the main run took, read from the records the stages wrote (None:
    a record made before stages were timed), the drafter-only τ included. Opt-in scaling
    points, ablation rows and the published-tree evaluations are left out: the first two report
    their own training minutes, the last its tokens/s. An evaluation counts each of its decoding
    runs once, however many drafters shared it."""
    out = Path(b.out_dir)

    def minutes(record: Path) -> float | None:
        seconds = json.loads(record.read_text()).get("seconds")
        return None if seconds is None else seconds / 60

    records = [
        ("distill", out / "distill" / "prompts" / ".done"),
        ("distill, target-written prompts", out / "distill" / "self" / ".done"),
        ("teacher-forced features", out / "teacher" / ".done"),
        ("distilled answers' features" if b.teacher_tokens else "features", out / "features" / ".done"),
    ]
    for name in b.drafters:
        records.append((f"train {name}", out / name / ".done"))
        if bench_drafter(name).tree:
            records.append((f"{name} tree", out / name / "tree.json"))
    times = {name: minutes(path) for name, path in records if path.is_file()}
    for name in b.eval_sets:
        runs = set()
        for drafter in b.drafters:
            marker = out / drafter / f"eval-{name}" / ".done"
            if marker.is_file():
                record = json.loads(marker.read_text())
                runs.add((tuple(record.get("decoded_with", [drafter])), record.get("seconds")))
        if runs:
            seconds = [s for _, s in runs]
            times[f"eval {name}"] = None if None in seconds else sum(seconds) / 60
    alone = [minutes(p) for name in b.drafters if (p := out / name / "drafter-only" / ".done").is_file()]
    if b.drafter_only and alone:
        times["held-out τ, drafter only"] = None if None in alone else sum(alone)
    return times
