"""Which target layers a drafter reads (``draft.feature_layers``), and the engines' rules for them.

EAGLE-3's three default layers, the reference DFlash rule that spreads one target layer per
drafter layer, and why a given list cannot be served: ids index the target's ``hidden_states``
(the input of layer i) as everywhere in draftheads.
"""

from __future__ import annotations

from draftheads.conf.errors import UserError


def dflash_layers_problem(layers: list[int], num_layers: int | None = None) -> str | None:
    """Why ``layers`` cannot be a DFlash drafter's ``draft.feature_layers``, or None.

    The engines' rule as for EAGLE-3 (ids index the target's ``hidden_states``: distinct,
    ascending, from 1, each the input of a layer the engine can capture, so at most L - 1), but any
    number of layers (the reference uses 1 to 5).
    """
    if not layers:
        return f"draft.feature_layers={list(layers)}: a DFlash drafter reads at least one target layer"
    return layer_ids_problem(layers, num_layers, None if num_layers is None else num_layers - 1)


def layer_ids_problem(layers: list[int], num_layers: int | None, top: int | None) -> str | None:
    """The engines' rule for feature layer ids: integers, distinct, ascending, from 1, at most ``top``."""
    key = f"draft.feature_layers={list(layers)}"
    if any(not isinstance(i, int) or isinstance(i, bool) for i in layers):
        return f"{key}: layer ids are integers"
    if len(set(layers)) != len(layers):
        return f"{key}: a layer is listed twice; list each layer once, ascending"
    if list(layers) != sorted(layers):
        return f"{key}: list the layers in ascending order, e.g. {sorted(layers)}; serving engines concatenate them in layer order"
    if layers[0] < 1:
        return f"{key}: layer 0 is the embedding output, which engines cannot capture; use ids from 1"
    if top is not None and layers[-1] > top:
        return f"{key}: the target has {num_layers} layers, so ids must be in 1..{top}"
    return None


def spread_layers(num_layers: int, depth: int) -> list[int]:
    """The reference DFlash rule (z-lab's ``build_target_layer_ids``), one target layer per drafter
    layer: ``[L // 2]`` for one, else ``round(1 + i (L - 4) / (depth - 1))`` for i < depth, evenly
    from layer 1 to L - 3. Refuses a depth whose ids would not be distinct layers of the target."""
    if depth == 1:
        return [num_layers // 2]
    span = num_layers - 4
    ids = [round(1 + i * span / (depth - 1)) for i in range(depth)]
    if span < 1 or len(set(ids)) != depth:
        raise UserError(
            f"draft.num_decoder_layers={depth} with draft.feature_rule=spread needs {depth} distinct target "
            f"layers in 1..{num_layers - 3}, and the target has {num_layers} layers; use at most "
            f"{max(1, num_layers - 3)} drafter layers, or draft.feature_rule=eagle3"
        )
    return ids


def dflash_feature_layers(
    feature_layers: list[int] | None, num_layers: int, rule: str = "eagle3", depth: int = 1
) -> list[int]:
    """The target layers a DFlash drafter reads: the given ones, else those of ``rule``: EAGLE-3's
    three (``eagle3``: one feature cache serves both drafters) or :func:`spread_layers`."""
    if feature_layers:
        return list(feature_layers)
    return spread_layers(num_layers, depth) if rule == "spread" else default_eagle3_layers(num_layers)


def feature_layers_problem(
    layers: list[int], version: int, num_layers: int | None = None, last: int | None = None
) -> str | None:
    """Why ``layers`` cannot be an EAGLE drafter's ``draft.feature_layers``, or None.

    Ids index the target's ``hidden_states`` (the input of layer i). Serving engines capture each
    auxiliary layer once, in ascending layer order, as ``hidden_states + residual``, which does
    not exist at layer 0; so the ids must be distinct, ascending and at least 1, or the engine
    permutes fc's input columns (unsorted), crashes (duplicates) or fails at layer 0. With
    ``num_layers`` the ids must also be at most ``last`` (default ``num_layers``: the final state).
    """
    key = f"draft.feature_layers={list(layers)}"
    count = 3 if version == 3 else 1
    if len(layers) != count:
        return f"{key}: EAGLE-{version} reads {count} target layer(s), this lists {len(layers)}"
    return layer_ids_problem(layers, num_layers, num_layers if last is None else last)


def default_eagle3_layers(num_layers: int) -> list[int]:
    """EAGLE-3's three feature layers for an ``num_layers``-layer target: distinct, ascending, >= 1.

    Inputs of layers 2, L//2 and L-3 (as in EAGLE-3, SpecForge and vLLM) when those are distinct
    (L >= 7); for 4 to 6 layers, the inputs of layers 1, L//2 and L-1. Targets with fewer than 4
    layers have fewer than three servable layers (1..L-1) and are refused: name the layers
    with ``draft.feature_layers`` or use EAGLE-1.
    """
    if num_layers >= 7:
        return [2, num_layers // 2, num_layers - 3]
    if num_layers >= 4:
        return [1, num_layers // 2, num_layers - 1]
    raise UserError(
        f"EAGLE-3 reads three distinct target layers from 1..L-1, and this target has only "
        f"{num_layers} layer(s); set draft.feature_layers=[...] explicitly or use draft=eagle"
    )


def eagle_input_layers(version: int, feature_layers: list[int] | None, num_layers: int) -> list[int]:
    """The target layers an EAGLE drafter reads: the given ones, else EAGLE-3's three or the last."""
    if feature_layers:
        return list(feature_layers)
    return default_eagle3_layers(num_layers) if version == 3 else [num_layers]
