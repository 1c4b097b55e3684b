"""What a maintainer's study adds to a bench run, and the refusal the installed bench gives it.

The pipeline (:mod:`~draftheads.bench.pipeline`) runs the stages every user runs. The opt-in
research rows (``bench.scaling_tokens``, ``bench.ablations``, ``bench.variants``) live in the
repository's ``bench/lab/``, which is not installed: ``python -m bench.lab.study`` from a checkout
hands the pipeline a :class:`Rows` that checks and runs them. The installed bench gets
:data:`NO_ROWS`, which refuses them in one line naming that command; a row name the study does
not have is refused first, listing its rows, so the command it advises runs.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from draftheads.conf.commands.args import BenchArgs, DemoArgs
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig

if TYPE_CHECKING:
    from draftheads.bench.drafter_only import MainData

STUDY_KEYS = ("scaling_tokens", "ablations", "variants")  # the rows only the lab runs
STUDY_COMMAND = "python -m bench.lab.study"  # from a checkout of the repository, at its top
ROW_KEYS = ("ablations", "variants")  # the study keys that name rows of the lab's table
LAB_ROWS = "draftheads.bench.lab.ablation_rows"  # that table, importable where the checkout is


def study_rows() -> list[str] | None:
    """The names of the study's rows, from the checkout's ``bench/lab``; None where draftheads
    is installed without it (then the study's own check names them)."""
    try:
        return list(importlib.import_module(LAB_ROWS).ABLATIONS)
    except ModuleNotFoundError as e:
        if e.name is not None and LAB_ROWS.startswith(e.name):
            return None
        raise


def check_row_names(names: list[str], key: str, rows: list[str]) -> None:
    """Refuse names under ``key`` (``bench.ablations``, ``bench.variants``) that are not among
    ``rows`` (``all`` stands for every row), listing the rows."""
    bad = [] if list(names) == ["all"] else [n for n in names if n not in rows]
    if bad:
        raise UserError(f"{key}: unknown rows {bad}; use all or some of {rows}")


class MainRun(NamedTuple):
    """What the main stages leave for a study's rows: the loaded target, the caches and the
    results so far."""

    cfg: BenchArgs | DemoArgs
    b: BenchConfig
    target: Any
    tok: Any
    cache: Path  # the teacher-forced cache, or the distilled answers' one without teacher text
    distilled: Path | None  # the distilled answers' cache beside teacher-forced text
    data: MainData | None  # what the streamed main drafters trained on
    lead: str | None  # the main drafter that leads the bench (BenchDrafter.lead), if any
    results: dict[str, Any]


class Rows:
    """A study's rows beside the main stages; this base runs none and refuses to be asked for
    any (the installed ``draftheads bench``)."""

    def check(self, b: BenchConfig) -> None:
        """Refuse, before the first stage, rows this run cannot make."""
        asked = [f"bench.{key}" for key in STUDY_KEYS if getattr(b, key)]
        rows = study_rows() if any(getattr(b, key) for key in ROW_KEYS) else None
        for key in ROW_KEYS if rows is not None else ():
            check_row_names(getattr(b, key), f"bench.{key}", rows)
        if asked:
            raise UserError(
                f"{', '.join(asked)}: the research rows are a maintainer's study, not part of the installed "
                f"bench; run them from a checkout of the repository with `{STUDY_COMMAND} <the same "
                "overrides>`, or leave them empty"
            )

    def overrides(self, b: BenchConfig) -> list[list[str]]:
        """The training overrides of every row that trains from the bench's feature caches (their
        layers join the caches')."""
        return []

    def run(self, main: MainRun) -> dict[str, Any]:
        """The rows' results, by the key the report reads them under (``scaling``, ...)."""
        return {}

    def command(self) -> str:
        """The command that ran the bench, as the docs page records it: ``draftheads bench`` with
        its overrides."""
        args = sys.argv[1:]
        return shlex.join(["draftheads", *args]) if args[:1] == ["bench"] else "draftheads bench"


NO_ROWS = Rows()
