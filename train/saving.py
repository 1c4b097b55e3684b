"""What a run writes of its drafter: the loadable drafter (and the target's LoRA adapters, when
it trained them) with its training provenance, into every checkpoint and into
``train.output_dir`` at the end, and beside the final one the resolved config and the model card.

Rank 0 writes; under ZeRO-3 every rank takes part in gathering the partitioned weights whole.
The provenance records the run config as plain data (:func:`config_dict`), the same dict that a
resume or a rerun in the same folder is compared against.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from torch import nn

from draftheads.conf.schema import Config
from draftheads.heads import Drafter
from draftheads.train.adapters import save_adapters
from draftheads.train.card import model_card
from draftheads.train.engine import gathered
from draftheads.train.metrics import read_metrics


def config_dict(cfg: Config) -> dict[str, Any]:
    """The resolved run config as plain data (what provenance records and resumes compare): its
    JSON form, as the run folder stores it (the typed config holds no interpolations; building
    an OmegaConf node of it would cost 50 times as much, on every save)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def export_drafter(
    drafter: Drafter, module: nn.Module, directory: Path, provenance: dict[str, Any], rank: int, stage: int
) -> None:
    """The loadable drafter, with ``provenance``, (and the target's LoRA adapters when the
    drafter requires them, from ``module``, the trained objective) into ``directory``; rank 0
    writes."""
    params = list(module.parameters())
    with gathered(params, stage):
        if rank == 0:
            drafter.provenance = provenance
            drafter.save_pretrained(directory)
            if drafter.requires_adapters:
                save_adapters(module.adapted, directory)


def write_run_files(
    out: Path, cfg: Config, drafter: Drafter, provenance: dict[str, Any], final: dict[str, float]
) -> None:
    """Beside the final drafter: ``resolved_config.yaml`` and the model card (``README.md``), which
    adds the tokens the run trained on and the last held-out metrics ``final`` (rank 0 only)."""
    import yaml

    # the YAML OmegaConf would write of ``cfg``, from its plain data (a structured node costs 5x)
    (out / "resolved_config.yaml").write_text(yaml.safe_dump(config_dict(cfg), sort_keys=False))
    provenance["tokens_seen"] = tokens_seen(out)
    (out / "README.md").write_text(model_card(drafter, provenance, final))


def tokens_seen(out: Path) -> int:
    """The training tokens ``metrics.jsonl`` in ``out`` counts (0 without one)."""
    rows = read_metrics(out) if (out / "metrics.jsonl").is_file() else []
    return int(sum(r.get("tokens", 0) for r in rows))
