"""The study's rows by name: the lookups, splits and checks every stage of the lab shares.

A row of :data:`~bench.lab.ablation_rows.ABLATIONS` is a list of overrides: ``draft.*`` and
``train.*`` ones train its drafter, ``decode.*`` ones change how it is decoded, and the bench's
own ``bench.data`` and ``bench.epochs`` pick its data and passes.
"""

from __future__ import annotations

from pathlib import Path

from draftheads.bench import teacher_stages
from draftheads.bench.extension import check_row_names
from draftheads.conf.errors import UserError
from draftheads.conf.schema import BenchConfig

from .ablation_rows import ABLATIONS, ROW_DATA


def ablation_rows(names: list[str], key: str = "bench.ablations") -> dict[str, list[str]]:
    """The named rows of :data:`ABLATIONS` (``all``: every row), refusing unknown names (given
    under ``key``)."""
    if names == ["all"]:
        return dict(ABLATIONS)
    check_row_names(names, key, list(ABLATIONS))
    return {n: ABLATIONS[n] for n in names}


def check_ablations(b: BenchConfig) -> None:
    """Refuse unknown ablation rows, and rows on regenerated answers when the bench writes none,
    before the first stage."""
    for name, extra in ablation_rows(list(b.ablations)).items():
        if row_settings(split_overrides(extra)[0])[1] == "regenerated" and not (
            b.distill_prompts and b.teacher_tokens
        ):
            raise UserError(
                f"bench.ablations row {name!r} trains on the target's regenerated answers, which a bench run "
                "writes with bench.distill_prompts > 0 beside teacher-forced text (bench.teacher_tokens > 0); "
                "set both (e.g. bench.distill_prompts=320 bench.teacher_tokens=40000), or leave the row out"
            )


def split_overrides(extra: list[str]) -> tuple[list[str], list[str]]:
    """(training overrides, ``decode.*`` overrides) of an ablation row."""
    return [o for o in extra if not o.startswith("decode.")], [o for o in extra if o.startswith("decode.")]


def row_settings(trained: list[str]) -> tuple[list[str], str, float | None]:
    """A row's training overrides split into (``train``/``draft`` overrides, its data: ``teacher``
    or ``regenerated``, its passes or None for ``bench.ablation_epochs``): the ``bench.data`` and
    ``bench.epochs`` keys are the bench's own, not the trainer's."""
    data, epochs, rest = "teacher", None, []
    for o in trained:
        key, _, value = o.partition("=")
        if key == "bench.data":
            data = value
        elif key == "bench.epochs":
            epochs = float(value)
        else:
            rest.append(o)
    if data not in ROW_DATA:
        raise ValueError(f"ablation row data {data!r} is not one of {ROW_DATA}")
    return rest, data, epochs


def cached_rows(b: BenchConfig) -> list[str]:
    """Every row trained from the bench's feature caches: the ablation rows and the variants."""
    return [*ablation_rows(list(b.ablations)), *b.variants]


def row_overrides(names: list[str]) -> list[list[str]]:
    """The training overrides of the named rows, without the bench's own keys."""
    return [row_settings(split_overrides(extra)[0])[0] for extra in ablation_rows(names).values()]


def row_layers(names: list[str], drafters: list[str], num_layers: int) -> list[int]:
    """Every target layer that the bench's drafters and the named rows (ablations, variants)
    read: the one feature cache each data source gets holds their union, so every row trains
    from it."""
    return teacher_stages.cache_layers(drafters, num_layers, row_overrides(names) if names else [])


def drafter_row(name: str) -> str:
    """The first row of :data:`ABLATIONS` trained as ``name`` is (the same training overrides):
    rows that differ only in decoding share its drafter."""
    trained = split_overrides(ABLATIONS[name])[0]
    return next(n for n, extra in ABLATIONS.items() if split_overrides(extra)[0] == trained)


# an override value "@<row>" names the drafter that ablation row trained (e.g. a start from it)
ROW_REF = "@"


def row_refs(extra: list[str]) -> list[str]:
    """The ablation rows whose drafters ``extra`` names as ``key=@<row>``."""
    return [v[len(ROW_REF) :] for v in (o.partition("=")[2] for o in extra) if v.startswith(ROW_REF)]


def with_refs(names: list[str]) -> list[str]:
    """``names`` with every row they refer to placed before its first user (trained first)."""
    ordered: list[str] = []
    for name in names:
        for ref in row_refs(ABLATIONS[name]):
            if ref not in ABLATIONS:
                raise UserError(f"ablation row {name!r} refers to {ref!r}, not a row of ABLATIONS")
            if ref not in ordered:
                ordered.append(ref)
        if name not in ordered:
            ordered.append(name)
    return ordered


def resolve_refs(extra: list[str], root: Path) -> list[str]:
    """``extra`` with each ``@<row>`` replaced by the folder of that row's trained drafter."""
    out = []
    for o in extra:
        key, _, value = o.partition("=")
        if value.startswith(ROW_REF):
            value = str(root / drafter_row(value[len(ROW_REF) :]).replace(" ", "-") / "drafter")
        out.append(f"{key}={value}")
    return out
