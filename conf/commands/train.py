"""``draftheads train``: a thin wrapper over the training recipe."""

from __future__ import annotations

from draftheads.conf.commands.args import TrainArgs, to_config


def train(args: TrainArgs) -> None:
    """Train the configured drafter; the recipe owns resume, checkpoints and the output folder.
    A recipe (``recipe=NAME``) asking for more GPUs than this run has is refused first, unless
    this is its dry run. A run stopped by an error gives its folder back at once (the lock, and
    the folder itself when the run created it and wrote nothing), not only when the process exits."""
    from draftheads.data.outdir import release_out_dir
    from draftheads.train import devices, recipe

    cfg = to_config(args)
    if not cfg.train.dry_run:
        devices.check_devices(cfg)
    try:
        recipe.run(cfg)
    except BaseException:
        release_out_dir(cfg.train.output_dir)
        raise
