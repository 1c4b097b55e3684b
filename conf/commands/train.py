"""``draftheads train``: a thin wrapper over the training recipe."""

from __future__ import annotations

from draftheads.conf.commands.args import TrainArgs, to_config


def train(args: TrainArgs) -> None:
    """Train the configured drafter; the recipe owns resume, checkpoints and the output folder."""
    from draftheads.train import recipe

    recipe.run(to_config(args))
