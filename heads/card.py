"""The model card (``README.md``) of a drafter, and the commands that serve its export.

One writer for both cards: the Hub card that ``draftheads push`` uploads and the card
``draftheads train`` writes beside a trained drafter (with its held-out metrics). Built with
huggingface_hub's ``ModelCard``/``ModelCardData``:

* ``base_model`` (the target from the checkpoint's fingerprint) with ``base_model_relation``,
  so the heads appear in the target's model tree;
* ``library_name: draftheads`` and tags (``speculative-decoding``, the kind and the kind's own);
* the training data and config (the checkpoint's provenance);
* τ and speedup from an eval report dict, and held-out training metrics, when given;
* usage snippets for draftheads, vLLM and SGLang, with the ``num_speculative_tokens`` the
  drafter's kind is served with (:func:`num_speculative_tokens`).

What differs per kind (tags, the one-line description, the engines and methods that serve it)
is asked from the kind's heads facts (:mod:`draftheads.heads.kinds`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from draftheads.heads.kinds import DrafterKind, drafter_kind

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
LOCAL = "<this directory>"  # the repo id a card written beside a local checkpoint uses


def natural_key(name: str) -> list:
    """Sort key reading digit runs as numbers: ``pos2`` before ``pos10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def num_speculative_tokens(conf: dict[str, Any]) -> int:
    """``num_speculative_tokens`` for serving the drafter with config ``conf``, as its kind says
    (``DrafterKind.num_speculative_tokens``, whose docstring in the kind's folder says why)."""
    return kind_of(conf).num_speculative_tokens(conf)


def serve_command(engine: str, method: str, target: str, draft: str, k: int, flags: str = "") -> str:
    """The command that serves ``target`` with the exported ``draft`` (also in docs/hub.md).

    ``k`` is :func:`num_speculative_tokens`; ``flags`` the format's ``serve_flags`` (what the engine
    needs beside the drafter, such as an attention backend or a block size), ``{block}`` there the
    ``k`` drafted tokens and the root. SGLang's three tuning flags of its tree-drafting methods
    (steps, top-k, draft tokens) are left to its auto choice (it takes all three or none).
    """
    extra = f" {flags.format(block=k + 1)}" if flags else ""
    if engine == "vllm":
        spec = json.dumps({"method": method, "model": draft, "num_speculative_tokens": k})
        return f"vllm serve {target} --speculative-config '{spec}'{extra}"
    return (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm {method} "
        f"--speculative-draft-model-path {draft}{extra}"
    )


def format_flags(kind: DrafterKind, engine: str, method: str) -> str:
    """The ``serve_flags`` of ``kind``'s format that ``engine`` serves as ``method``."""
    return next(
        (f.serve_flags for f in kind.formats.values() if (f.engine, f.method) == (engine, method)), ""
    )


def is_hub_id(name: str) -> bool:
    """True for ``ORG/NAME`` (a Hub repo id), False for local paths and bare names like ``tiny-llama``."""
    return bool(REPO_ID.match(name)) and not Path(name).expanduser().exists()


def dataset_ids(provenance: dict[str, Any]) -> list[str]:
    """Hub dataset ids named in the provenance's data section (for the card's ``datasets`` field)."""
    data = provenance.get("data")
    values: list[Any] = []
    if isinstance(data, str):
        values = [data]
    elif isinstance(data, dict):
        values = [data.get(k) for k in ("name", "dataset", "path", "datasets")]
    elif isinstance(data, list):
        values = data
    flat = [v for x in values for v in (x if isinstance(x, list) else [x])]
    return sorted({v for v in flat if isinstance(v, str) and is_hub_id(v)})


def drafter_tags(conf: dict[str, Any]) -> list[str]:
    """``speculative-decoding``, the kind, ``draftheads`` and the kind's own tags."""
    return sorted({"speculative-decoding", conf["kind"], "draftheads", *kind_of(conf).tags(conf)})


def describe(conf: dict[str, Any]) -> str:
    """One line: what this drafter is."""
    return kind_of(conf).describe(conf)


def metrics_section(metrics: dict[str, Any] | None) -> str:
    """Held-out training metrics (accuracies, simulated τ) as a table; empty without any."""
    ordered = sorted((metrics or {}).items(), key=lambda kv: natural_key(kv[0]))
    rows = [f"| `{k}` | {v:.4f} |" for k, v in ordered if isinstance(v, float)]
    if not rows:
        return ""
    return (
        "## Held-out metrics (last training evaluation)\n\n"
        "Accuracies compare the drafter's top-1/top-k with the target's greedy token; `tau` is the\n"
        "simulated acceptance length of a top-1 chain (for a block drafter, of a drafted block): tokens per\n"
        "target forward, teacher-forced on the held-out rows; exact when those rows are the target's\n"
        "own greedy text.\n\n"
        "| metric | value |\n|---|---|\n" + "\n".join(rows) + "\n\n"
    )


def results_section(report: dict[str, Any] | None) -> str:
    if not report:
        return "No evaluation report is attached; run `draftheads eval` to measure τ and speedup.\n"
    rows = {
        "mean accepted tokens per target forward (τ)": f"{report['tau']:.2f}",
        "speedup vs plain greedy decoding": f"{report['speedup']:.2f}×" if "speedup" in report else "n/a",
        "tokens/s (speculative)": f"{report['tokens_per_s']:.1f}" if "tokens_per_s" in report else "n/a",
        "tokens/s (baseline)": f"{report['baseline_tokens_per_s']:.1f}"
        if "baseline_tokens_per_s" in report
        else "n/a",
    }
    lines = ["| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows.items()]
    env = report.get("environment") or report.get("env")
    if isinstance(env, dict):
        lines.append("")
        lines.append(
            "Measured with: "
            + ", ".join(f"{k} {v}" for k, v in env.items() if isinstance(v, str | int | float))
        )
    return "\n".join(lines) + "\n"


def usage_section(conf: dict[str, Any], repo_id: str) -> str:
    """Snippets for draftheads, vLLM and SGLang (the engines need ``draftheads export`` first)."""
    target = conf["target"]["name"]
    # heads trained with LoRA adapters on the target: from_pretrained puts them on the target itself
    load = f'drafter = Drafter.from_pretrained("{repo_id}", target=target, tokenizer=tok)'
    py = f"""```python
from draftheads.decode import SpeculativeGenerator
from draftheads.heads import Drafter
from transformers import AutoModelForCausalLM, AutoTokenizer

target = AutoModelForCausalLM.from_pretrained("{target}")
tok = AutoTokenizer.from_pretrained("{target}")
{load}
ids = tok("Hello", return_tensors="pt").input_ids
out = SpeculativeGenerator(target, drafter).generate(ids, max_new_tokens=128)
```
"""
    parts = ["### draftheads\n", py]
    stem = repo_id.split("/")[-1] if repo_id != LOCAL else conf["kind"]
    needs = export_target(conf)
    for engine, method in engine_methods(conf):
        title = "vLLM" if engine == "vllm" else "SGLang"
        out = f"./{stem}-{engine}"
        flags = format_flags(kind_of(conf), engine, method)
        cmd = serve_command(engine, method, target, out, num_speculative_tokens(conf), flags)
        parts.append(
            f"### {title}\n\n```bash\ndraftheads export heads={repo_id} format={engine} out_dir={out}{needs}\n{cmd}\n```\n"
        )
    if kind_of(conf).speculators_refusal(conf) is None:
        out = f"./{stem}-speculators"
        parts.append(
            f"### vLLM, speculators format\n\nThe export carries its target and a greedy chain of "
            f"{num_speculative_tokens(conf)} drafted tokens as its default proposal, so it is served "
            f"alone:\n\n```bash\ndraftheads export heads={repo_id} format=speculators out_dir={out}{needs}\n"
            f"vllm serve {out}\n```\n"
        )
    unserved = sglang_refusal(conf)
    if unserved:
        parts.append(f"### SGLang\n\n{unserved}\n")
    return "\n".join(parts)


def export_target(conf: dict[str, Any]) -> str:
    """The ``target=`` overrides an export of ``conf`` needs (it writes some of the target's weights,
    such as its lm_head or rows of it: ``DrafterKind.export_needs_target``), else ""."""
    needs = kind_of(conf).export_needs_target(conf)
    return f" target=hf target.name_or_path={conf['target']['name']}" if needs else ""


def engine_methods(conf: dict[str, Any]) -> list[tuple[str, str]]:
    """(engine, method) pairs that serve the drafter with config ``conf``."""
    return kind_of(conf).engine_methods(conf)


def sglang_refusal(conf: dict[str, Any]) -> str | None:
    """Why SGLang cannot serve the drafter with config ``conf``, or None when it can."""
    return kind_of(conf).sglang_refusal(conf)


def kind_of(conf: dict[str, Any]) -> DrafterKind:
    """The kind of the drafter with config ``conf``."""
    return drafter_kind(conf["kind"])


def model_card(
    conf: dict[str, Any],
    repo_id: str = LOCAL,
    report: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
):
    """The model card (a ``huggingface_hub.ModelCard``) of a drafter with config ``conf``.

    ``repo_id`` is where it is published (default: a local directory); ``report`` an eval
    report dict (τ, speedup, tokens/s); ``metrics`` the held-out metrics of training.
    """
    from huggingface_hub import ModelCard, ModelCardData

    target = conf["target"]
    provenance = conf.get("provenance") or {}
    data = ModelCardData(
        library_name="draftheads",
        tags=drafter_tags(conf),
        pipeline_tag="text-generation",
        base_model=target["name"] if is_hub_id(target["name"]) else None,
        base_model_relation="adapter" if is_hub_id(target["name"]) else None,
        datasets=dataset_ids(provenance) or None,
    )
    body = f"""
# {repo_id.split("/")[-1] if repo_id != LOCAL else describe(conf).split(":")[0] + " for " + target["name"]}

Speculative-decoding drafter for [{target["name"]}]({"https://huggingface.co/" + target["name"] if is_hub_id(target["name"]) else "#target"}):
{describe(conf)}, trained with draftheads. Greedy output with
the drafter is the target's own; the drafter only makes it faster.

Target fingerprint (checked on load): `{target["architecture"]}`, hidden {target["hidden_size"]},
vocab {target["vocab_size"]}, {target["num_layers"]} layers, tokenizer `{target["tokenizer_hash"][:12] or "n/a"}`.
{"**These heads were trained jointly with LoRA adapters on the target (in `adapter/`); `Drafter.from_pretrained` puts them on the target.**" if conf.get("requires_adapters") else ""}

## Results

{results_section(report)}
{metrics_section(metrics)}## Usage

{usage_section(conf, repo_id)}
## Training data and config

```json
{json.dumps(provenance, indent=2, sort_keys=True, default=str)}
```

## Drafter config

```json
{json.dumps(conf["spec"], indent=2, sort_keys=True, default=str)}
```
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
