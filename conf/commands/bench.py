"""``draftheads bench``, ``demo``, ``speed``, ``train-speed``, ``data-speed``, ``engine``: the
benchmark room's doors."""

from __future__ import annotations

from draftheads.conf.commands.args import (
    BenchArgs,
    DataSpeedArgs,
    DemoArgs,
    EngineArgs,
    SpeedArgs,
    TrainSpeedArgs,
)


def bench(args: BenchArgs) -> None:
    """The whole pipeline at benchmark size (``make bench``)."""
    from draftheads.bench.pipeline import bench as run

    run(args)


def demo(args: DemoArgs) -> None:
    """A small drafter trained, evaluated and streaming, in minutes (``make demo``), at fixed sizes."""
    from draftheads.bench.pipeline import demo as run

    run(args)


def speed(args: SpeedArgs) -> None:
    """Speculative against plain greedy decoding, tokens/s per batch size; with
    ``speed.workloads=true``, the workload rows (backend, batches, long prompts, sampling)."""
    if args.speed.workloads:
        from draftheads.bench.workloads import run
    else:
        from draftheads.bench.decode_speed import speed as run

    run(args)


def train_speed(args: TrainSpeedArgs) -> None:
    """Training tokens/s of the bench recipe on a feature cache."""
    from draftheads.bench.train_speed import train_speed as run

    run(args)


def data_speed(args: DataSpeedArgs) -> None:
    """Tokenising and feature-extraction tokens/s."""
    from draftheads.bench.data_speed import data_speed as run

    run(args)


def engine(args: EngineArgs) -> dict:
    """vLLM's speculative-decoding counters beside draftheads' decoder running the same chain on
    the same chat-templated prompts, per export format; one table, and the record as JSON."""
    from draftheads.bench.engine_compare import engine as run

    return run(args)
