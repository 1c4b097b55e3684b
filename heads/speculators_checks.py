"""Checks of a speculators ``config.json``'s own fields, run before it is read as a drafter.

Each names the field as the file writes it (``transformer_layer_config.layer_types``,
``eagle_aux_hidden_state_layer_ids``, ...) with its value, in one line: the file is what the
user fixes, not a ``draft.*`` key of ours, and not transformers' list of every model type.
"""

from __future__ import annotations

import difflib
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.layers import layer_ids_problem

DEFAULT_LAYER_TYPE = "qwen3"  # speculators saves the layer config as a diff against this class
EAGLE_IDS = "eagle_aux_hidden_state_layer_ids"


def check_layer_config(config: dict[str, Any], where: str) -> None:
    """``transformer_layer_config``: present, of a transformers model type, and a valid config of
    that type (``layer_types`` as long as ``num_hidden_layers``, ...)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict) or not layer:
        raise UserError(
            f"{where}: config.json has no transformer_layer_config (the draft layer's model_type, sizes and "
            "layer count), so its layer would be read as the class defaults (a 4096-wide model); the file is "
            "incomplete: add the transformer_layer_config it was trained with, or export it again"
        )
    model_type = layer.get("model_type", DEFAULT_LAYER_TYPE)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        near = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UserError(
            f"{where}: transformer_layer_config.model_type={model_type!r} is not a transformers model type"
            f"{hint}; set the draft layer's model type, e.g. llama or qwen3"
        )
    kinds, count = layer.get("layer_types"), layer.get("num_hidden_layers")
    if isinstance(kinds, list) and isinstance(count, int) and len(kinds) != count:
        raise UserError(
            f"{where}: transformer_layer_config.layer_types has {len(kinds)} entries but "
            f"transformer_layer_config.num_hidden_layers={count}; list one layer type per layer"
        )
    try:
        AutoConfig.for_model(model_type, **{k: v for k, v in layer.items() if k != "model_type"})
    except Exception as e:  # transformers and huggingface_hub validators raise many types
        detail = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        raise UserError(
            f"{where}: transformer_layer_config is not a valid {model_type} config ({detail[-1][:200]}); "
            "the file is damaged"
        ) from None


def check_eagle_layer_ids(config: dict[str, Any], num_layers: int, where: str) -> None:
    """``eagle_aux_hidden_state_layer_ids`` (when given; absent, the engines pick the target's
    default three): three distinct ascending target layers of a target with ``num_layers``."""
    ids = config.get(EAGLE_IDS)
    if ids is None:
        return
    if not isinstance(ids, list):
        raise UserError(f"{where}: {EAGLE_IDS}={ids!r} must be a list of three target layer ids")
    problem = (
        f"{EAGLE_IDS}={ids}: the drafter reads 3 target layers, this lists {len(ids)}"
        if len(ids) != 3
        else layer_ids_problem(ids, num_layers, num_layers, EAGLE_IDS)
    )
    if problem:
        raise UserError(f"{where}: {problem} (the file is damaged, or was written for another target)")
