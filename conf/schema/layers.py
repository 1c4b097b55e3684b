"""The engines' rule for the target layers a drafter reads (``draft.<kind>.feature_layers``): ids index
the target's ``hidden_states`` (the input of layer i) as everywhere in draftheads.

Each kind's own layer facts (its default layers, or a rule such as z-lab's reference one that
spreads one target layer per drafter layer) are in its config module
(``conf/schema/kinds/<kind>.py``).
"""

from __future__ import annotations


def layer_ids_problem(layers: list[int], num_layers: int | None, top: int | None, name: str) -> str | None:
    """The engines' rule for feature layer ids (``name``: the key or file field that lists them,
    ``draft.<kind>.feature_layers``): integers, distinct, ascending, from 1, at most ``top``."""
    key = f"{name}={list(layers)}"
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
