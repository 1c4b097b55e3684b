"""``draftheads <command> [hydra overrides]``: the one command line.

Each command composes the Hydra config in this package (``conf/config.yaml`` and its
groups), validates it against :class:`draftheads.conf.schema.Config`, and hands the typed
object to the command's function. ``--cfg job`` prints the resolved config instead.

A user error (a bad key or value, a missing file, a wrong checkpoint) prints one line and
exits non-zero; set ``DRAFTHEADS_DEBUG=1`` to see the traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from draftheads.conf.errors import UserError

# command -> (module:function, one-line help, example)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "data": (
        "draftheads.data.commands:data",
        "prepare a training set; print counts, skips and masked examples",
        "draftheads data data.path=train.jsonl data.show=3",
    ),
    "distill": (
        "draftheads.data.commands:distill",
        "regenerate answers with the target (resumable JSONL shards)",
        "draftheads distill data.path=prompts.jsonl",
    ),
    "features": (
        "draftheads.data.commands:features",
        "cache the target features a drafter trains on",
        "draftheads features draft=eagle3",
    ),
    "train": (
        "draftheads.train.recipe:main",
        "train a drafter on the frozen target",
        "draftheads train draft=eagle train.max_steps=500",
    ),
    "tree": (
        "draftheads.decode.commands:tree",
        "pick the best Medusa tree from measured head accuracies",
        "draftheads tree heads=outputs/train",
    ),
    "generate": (
        "draftheads.decode.commands:generate",
        "stream a speculative answer, then print tau and tokens/s",
        'draftheads generate heads=outputs/train prompt="Explain KV caches"',
    ),
    "eval": (
        "draftheads.decode.evaluate:main",
        "acceptance (tau) and speedup on a prompt set, with baselines",
        "draftheads eval heads=outputs/train eval.prompts=heldout",
    ),
    "push": (
        "draftheads.heads.hub:push",
        "upload a checkpoint with a model card to the Hugging Face Hub",
        "draftheads push heads=outputs/train repo_id=ORG/NAME",
    ),
    "export": (
        "draftheads.heads.export:export",
        "export a checkpoint for vLLM or SGLang",
        "draftheads export heads=outputs/train format=vllm out=outputs/vllm",
    ),
    "info": (
        "draftheads.heads.commands:info",
        "print a checkpoint's kind, shapes and target fingerprint",
        "draftheads info heads=outputs/train",
    ),
    "demo": (
        "draftheads.decode.bench:demo",
        "train, evaluate and stream on the embedded default (make demo)",
        "draftheads demo",
    ),
    "bench": ("draftheads.decode.bench:bench", "the end-to-end benchmark (make bench)", "draftheads bench"),
}

GROUPS = ("target", "draft", "data", "train", "deepspeed", "logger", "decode", "eval")


def usage() -> str:
    lines = ["usage: draftheads <command> [key=value ...] [--cfg job]", "", "commands:"]
    for name, (_, help_, example) in COMMANDS.items():
        lines.append(f"  {name:<10} {help_}")
        lines.append(f"  {'':<10}   e.g. {example}")
    lines += [
        "",
        f"config groups: {', '.join(GROUPS)} (e.g. draft=eagle3 target=tiny-llama)",
        "any key can be overridden: train.lr=3e-4 decode.max_new_tokens=64",
        "`draftheads <command> --cfg job` prints the resolved config.",
    ]
    return "\n".join(lines)


def compose(overrides: list[str]):
    """Compose and validate the config; returns the typed :class:`Config` and its DictConfig."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from draftheads.conf.schema import register

    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="draftheads.conf", version_base="1.3"):
            dcfg = hydra_compose(config_name="config", overrides=overrides)
        return OmegaConf.to_object(dcfg), dcfg
    except UserError:
        raise
    except Exception as e:  # Hydra/OmegaConf errors: reduce them to one line
        raise UserError(config_error_line(e)) from None
    finally:
        GlobalHydra.instance().clear()


def config_error_line(e: BaseException) -> str:
    """One line from a Hydra/OmegaConf composition error, naming the key."""
    err = e
    while err.__cause__ is not None and not getattr(err, "full_key", None):
        err = err.__cause__
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    key = getattr(err, "full_key", None)
    if "not in" in msg or "Key '" in msg and "not" in msg:
        return (
            f"unknown config key {key or msg}: {msg}; run `draftheads <command> --cfg job` to see valid keys"
        )
    if "Could not find" in msg or "Could not load" in msg:
        return f"{msg}; check the group option name (e.g. draft=medusa|medusa2|eagle|eagle3)"
    if key:
        return f"bad value for {key}: {msg}"
    return f"invalid config: {msg}"


def resolve(spec: str) -> Callable:
    module, func = spec.split(":")
    try:
        return getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("draftheads"):
            raise UserError(f"this command is not available in this build ({e.name} is missing)") from None
        raise


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; run `draftheads --help` for the list", file=sys.stderr)
        return 2
    show_cfg = False
    if "--cfg" in rest:
        i = rest.index("--cfg")
        show_cfg = True
        del rest[i : i + 2]
    if "-h" in rest or "--help" in rest:
        spec, help_, example = COMMANDS[command]
        print(f"draftheads {command}: {help_}\n  e.g. {example}\n\n{usage()}")
        return 0
    try:
        cfg, dcfg = compose(rest)
        if show_cfg:
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(dcfg, resolve=True), end="")
            return 0
        resolve(COMMANDS[command][0])(cfg)
        return 0
    except UserError as e:
        if os.environ.get("DRAFTHEADS_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "error: interrupted; completed work is saved, rerun the same command to resume", file=sys.stderr
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
