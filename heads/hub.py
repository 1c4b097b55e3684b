"""Publish a drafter checkpoint to the Hugging Face Hub, with a model card.

``draftheads push heads=DIR repo_id=ORG/NAME [private=true] [revision=BRANCH]`` and
``Drafter.push_to_hub(repo_id)`` upload ``config.json``, ``model.safetensors`` and a
``README.md`` model card built with huggingface_hub's ``ModelCard``/``ModelCardData``:

* ``base_model`` (the target from the checkpoint's fingerprint) with ``base_model_relation``,
  so the heads appear in the target's model tree;
* ``library_name: draftheads`` and tags (``speculative-decoding``, ``medusa`` or ``eagle``);
* the training data and config (the checkpoint's provenance);
* τ and speedup from the latest eval report (``report.json`` in the heads directory, or a
  path given), when there is one;
* usage snippets for draftheads, vLLM and SGLang.

Loading back is ``Drafter.from_pretrained("ORG/NAME", revision=...)`` (huggingface_hub's
download and cache; offline from the cache with ``HF_HUB_OFFLINE=1``).

The token comes from huggingface_hub's usual sources (``HF_TOKEN``, ``hf auth login``); this
module never reads, prints or logs it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.heads.checkpoint import (
    ADAPTER_DIR,
    CONFIG_NAME,
    WEIGHTS_NAME,
    load_checkpoint,
    read_config,
)

CARD_NAME = "README.md"
REPORT_NAME = "report.json"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
OPTIONAL_FILES = ("tree.json", "resolved_config.yaml")
EAGLE_SPECULATIVE_TOKENS = 3  # a chain length the engines serve well; any value works for EAGLE


def num_speculative_tokens(conf: dict[str, Any]) -> int:
    """``num_speculative_tokens`` for serving the drafter with config ``conf``.

    Medusa: exactly the head count. vLLM copies the value into the number of heads it builds
    (``num_lookahead_tokens``) and drops unknown keys, so a smaller value serves fewer heads and
    a larger one builds heads with no weights. EAGLE drafts autoregressively: any chain length.
    """
    if conf["kind"] == "medusa":
        return int(conf["spec"]["num_heads"])
    return EAGLE_SPECULATIVE_TOKENS


def serve_command(engine: str, method: str, target: str, draft: str, k: int) -> str:
    """The command that serves ``target`` with the exported ``draft`` (also in docs/hub.md).

    ``k`` is :func:`num_speculative_tokens`. SGLang's three tuning flags are left to its auto
    choice (set all three or none).
    """
    if engine == "vllm":
        spec = json.dumps({"method": method, "model": draft, "num_speculative_tokens": k})
        return f"vllm serve {target} --speculative-config '{spec}'"
    return (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm {method} "
        f"--speculative-draft-model-path {draft}"
    )


def is_hub_id(name: str) -> bool:
    """True for ``ORG/NAME`` (a Hub repo id), False for local paths and bare names like ``tiny-llama``."""
    return bool(REPO_ID.match(name)) and not Path(name).expanduser().exists()


def read_report(path: Path) -> dict[str, Any]:
    """A draftheads eval ``report.json``; a one-line error when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); rerun draftheads eval") from None
    if not isinstance(data, dict) or "tau" not in data:
        raise UserError(f"{path} is not a draftheads eval report (no 'tau')")
    return data


def _same_dir(a: Any, b: Path) -> bool:
    return bool(a) and Path(str(a)).expanduser().resolve() == b.resolve()


def find_report(
    heads_dir: Path, report: str | os.PathLike | None = None, search: tuple[str | os.PathLike, ...] = ()
) -> Path | None:
    """The eval report to quote: ``report`` if given (a report.json or its directory); else the
    newest of ``heads_dir/report.json`` and any report in ``search`` directories whose ``heads``
    field is this heads directory (``draftheads eval`` writes to ``eval.output_dir``)."""
    if report:
        path = Path(report) / REPORT_NAME if Path(report).is_dir() else Path(report)
        if not path.is_file():
            raise UserError(
                f"report={report}: no {REPORT_NAME} there; run draftheads eval first or drop report="
            )
        read_report(path)
        return path
    found = [heads_dir / REPORT_NAME] if (heads_dir / REPORT_NAME).is_file() else []
    for d in search:
        path = Path(d) / REPORT_NAME
        if path.is_file() and path.resolve() not in {f.resolve() for f in found}:
            try:
                if _same_dir(json.loads(path.read_text()).get("heads"), heads_dir):
                    found.append(path)
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue
    return max(found, key=lambda f: f.stat().st_mtime) if found else None


def files_to_push(heads_dir: Path) -> dict[str, Path]:
    """What a published drafter holds: weights and config, Medusa-2 LoRA adapters, the measured
    decoding tree and the resolved training config when present; never optimizer checkpoints."""
    files = {CONFIG_NAME: heads_dir / CONFIG_NAME, WEIGHTS_NAME: heads_dir / WEIGHTS_NAME}
    for name in OPTIONAL_FILES:
        if (heads_dir / name).is_file():
            files[name] = heads_dir / name
    adapters = heads_dir / ADAPTER_DIR
    if adapters.is_dir():
        for f in sorted(adapters.rglob("*")):
            if f.is_file():
                files[f.relative_to(heads_dir).as_posix()] = f
    return files


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
    tags = ["speculative-decoding", conf["kind"], "draftheads"]
    if conf["kind"] == "eagle":
        tags.append(
            f"eagle{conf['spec'].get('version', 1)}" if conf["spec"].get("version") == 3 else "eagle1"
        )
    else:
        tags.append(
            "medusa-1"
            if conf["spec"].get("lm_head") == "copy"
            else "medusa-2"
            if conf.get("requires_adapters")
            else "medusa"
        )
    return sorted(set(tags))


def describe(conf: dict[str, Any]) -> str:
    """One line: what this drafter is."""
    spec = conf["spec"]
    if conf["kind"] == "medusa":
        lm = "own lm_heads" if spec.get("lm_head") == "copy" else "the target's shared lm_head"
        return f"{spec['num_heads']} Medusa heads × {spec['num_layers']} ResBlock(s), with {lm}"
    version = spec.get("version", 1)
    layers = spec.get("feature_layers")
    extra = (
        f", draft vocabulary {spec.get('draft_vocab_size')}, features from layers {layers}"
        if version == 3
        else ""
    )
    return f"an EAGLE-{version} drafter with {spec.get('num_decoder_layers', 1)} decoder layer(s){extra}"


def results_section(report: dict[str, Any] | None) -> str:
    if not report:
        return "No evaluation report was found when these heads were pushed; run `draftheads eval` to measure them.\n"
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
    # Medusa-2: from_pretrained puts the checkpoint's LoRA adapters on the target itself.
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
    if conf["kind"] == "medusa":
        engines = [("vllm", "medusa")]
    else:
        v3 = conf["spec"].get("version") == 3
        engines = [("vllm", "eagle3" if v3 else "eagle"), ("sglang", "EAGLE3" if v3 else "EAGLE")]
    for engine, method in engines:
        name = "vLLM" if engine == "vllm" else "SGLang"
        out = f"./{repo_id.split('/')[-1]}-{engine}"
        cmd = serve_command(engine, method, target, out, num_speculative_tokens(conf))
        parts.append(
            f"### {name}\n\n```bash\ndraftheads export heads={repo_id} format={engine} out={out}\n{cmd}\n```\n"
        )
    if conf["kind"] == "medusa":
        parts.append(
            "### SGLang\n\nSGLang does not support Medusa heads; use vLLM or the draftheads decoder.\n"
        )
    return "\n".join(parts)


def model_card(conf: dict[str, Any], repo_id: str, report: dict[str, Any] | None = None):
    """The Hub model card (a ``huggingface_hub.ModelCard``) for a drafter with config ``conf``."""
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
# {repo_id.split("/")[-1]}

Speculative-decoding drafter for [{target["name"]}]({"https://huggingface.co/" + target["name"] if is_hub_id(target["name"]) else "#target"}):
{describe(conf)}, trained with draftheads. Greedy output with
the drafter is the target's own; the drafter only makes it faster.

Target fingerprint (checked on load): `{target["architecture"]}`, hidden {target["hidden_size"]},
vocab {target["vocab_size"]}, {target["num_layers"]} layers, tokenizer `{target["tokenizer_hash"][:12] or "n/a"}`.
{"**These heads were trained jointly with LoRA adapters on the target (in `adapter/`); `Drafter.from_pretrained` puts them on the target.**" if conf.get("requires_adapters") else ""}

## Results

{results_section(report)}
## Usage

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


def push_folder(
    heads_dir: str | os.PathLike,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    token: str | None = None,
    commit_message: str | None = None,
    report: str | os.PathLike | None = None,
    endpoint: str | None = None,
    search: tuple[str | os.PathLike, ...] = (),
) -> str:
    """Upload a draftheads checkpoint directory with its model card; returns the commit URL.

    The checkpoint is read and validated first (a damaged one is never published). ``token``
    None means huggingface_hub's usual sources. ``revision`` is a branch, created if missing.
    The eval report quoted (and uploaded as report.json) is ``report``, or the newest one found
    in ``heads_dir`` and the ``search`` directories (see :func:`find_report`).
    """
    import httpx2
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    heads_dir = Path(heads_dir)
    if not REPO_ID.match(repo_id or ""):
        raise UserError(f"repo_id={repo_id!r} is not a Hub repo id; use repo_id=ORG/NAME")
    if not heads_dir.is_dir():
        raise UserError(f"heads={heads_dir}: no such checkpoint directory")
    conf = read_config(heads_dir)
    load_checkpoint(heads_dir)  # config and weights agree, all finite: never publish a damaged one
    if conf.get("requires_adapters") and not (heads_dir / ADAPTER_DIR).is_dir():
        raise UserError(
            f"{heads_dir}: Medusa-2 heads need their {ADAPTER_DIR}/ (LoRA adapters); it is missing"
        )
    report_path = find_report(heads_dir, report, search)
    card = model_card(conf, repo_id, read_report(report_path) if report_path else None)
    files = files_to_push(heads_dir)
    if report_path:
        files[REPORT_NAME] = report_path
    api = HfApi(endpoint=endpoint, token=token)
    ops = [CommitOperationAdd(path_in_repo=k, path_or_fileobj=str(v)) for k, v in files.items()]
    ops.append(CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=str(card).encode()))
    try:
        api.create_repo(repo_id, private=private or None, exist_ok=True)  # None: the owner's default
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations=ops,
            commit_message=commit_message or f"Upload {conf['kind']} drafter with draftheads",
            revision=revision,
        )
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        hint = (
            "check your token (hf auth login or HF_TOKEN)"
            if status in (401, 403)
            else "check the repo id and network"
        )
        raise UserError(f"push to {repo_id} failed (HTTP {status or '?'}); {hint}") from None
    except OfflineModeIsEnabled:
        raise UserError(f"push to {repo_id}: HF_HUB_OFFLINE is set; unset it to publish") from None
    except (OSError, httpx2.HTTPError) as e:
        raise UserError(f"push to {repo_id} failed ({type(e).__name__}); check the network") from None
    return str(info.commit_url)


def push(cfg) -> str:
    """CLI entry: ``draftheads push heads=DIR repo_id=ORG/NAME [private=true] [revision=BRANCH]``."""
    if not cfg.heads or not cfg.repo_id:
        raise UserError("draftheads push needs heads=DIR and repo_id=ORG/NAME")
    url = push_folder(
        cfg.heads,
        cfg.repo_id,
        private=bool(cfg.private),
        revision=cfg.revision,
        search=(cfg.eval.output_dir,),
    )
    print(f"pushed {cfg.heads} to {cfg.repo_id}{'@' + cfg.revision if cfg.revision else ''}: {url}")
    return url
