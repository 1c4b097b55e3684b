"""The model card (``README.md``) written beside a trained drafter."""

from __future__ import annotations

from typing import Any

KIND_NAMES = {
    ("medusa", False): "Medusa-1 heads",
    ("medusa", True): "Medusa-2 heads (with LoRA adapters on the target)",
    ("eagle", 1): "EAGLE-1 drafter",
    ("eagle", 3): "EAGLE-3 drafter",
}


def describe(drafter) -> str:
    if drafter.kind == "medusa":
        return KIND_NAMES[("medusa", drafter.requires_adapters)]
    return KIND_NAMES[("eagle", drafter.version)]


def model_card(drafter, provenance: dict[str, Any], final: dict[str, float]) -> str:
    """Markdown with hub metadata (base_model links the drafter to its target's model tree)."""
    fp = drafter.target_fingerprint
    what = describe(drafter)
    rows = "\n".join(f"| `{k}` | {v:.4f} |" for k, v in sorted(final.items()) if isinstance(v, float))
    adapters = (
        "\nThe target's LoRA adapters are in `adapter/`; load them first "
        "(`draftheads.train.adapters.load_adapters(target, dir)`), the heads refuse a target without them.\n"
        if drafter.requires_adapters
        else ""
    )
    data = provenance.get("data", {})
    return f"""---
base_model: {fp.name}
base_model_relation: adapter
library_name: draftheads
tags: [speculative-decoding, {drafter.kind}]
---

# {what} for {fp.name}

Trained with `draftheads train` for {provenance.get("steps")} optimizer steps
({provenance.get("tokens_seen", 0):,} tokens) on {data.get("rows", "?")} rows of `{data.get("source", "?")}`.
{adapters}
```python
from draftheads.heads import Drafter, load_target
from draftheads.conf.schema.heads import TargetConfig
target, tok = load_target(TargetConfig(name_or_path="{fp.name}"))
drafter = Drafter.from_pretrained("<this directory>", target=target, tokenizer=tok)
```

## Held-out metrics (last evaluation)

Accuracies compare the drafter's top-1/top-k with the target's greedy token; `tau` is the
simulated acceptance length of a top-1 chain (tokens per target forward, teacher-forced on
the held-out rows; exact when those rows are the target's own greedy text).

| metric | value |
|---|---|
{rows}

Full training config: `resolved_config.yaml`; curves: `metrics.jsonl`.
"""
