"""Every ``draftheads`` command: its entry function, its typed arguments, help and hints.

This module is cheap to import (no torch): the command line reads it to check overrides and
print help, and imports a command's module only to run it. One word per concept on the command
line: every output location is ``out_dir`` (:data:`USER_NAMES` maps it onto the schema).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftheads.conf.commands import args as a
from draftheads.conf.schema.bench_drafters import row_base

# The examples train, bench and serve the bench's main drafter: its draft group and its folder.
EXAMPLE_DRAFT = row_base().draft[0]
EXAMPLE_FOLDER = row_base().name


@dataclass(frozen=True)
class Command:
    """One command: ``entry`` (``module:function``), its argument dataclass, help and an example.

    ``hints`` maps a key the command does not read (or its group) to the one-line advice given
    when it is overridden (a key inside a group the command reads is left out of its help too); ``{key}`` and ``{value}`` are replaced by what the user typed.
    """

    entry: str
    args: type
    help: str
    example: str
    hints: dict[str, str] = field(default_factory=dict)


_PROMPT_HINT = "{command} reads its prompt from prompt=; use prompt={value} (or --prompt, prompt_file=PATH)"

COMMANDS: dict[str, Command] = {
    "data": Command(
        "draftheads.conf.commands.data:data",
        a.DataArgs,
        "prepare a training set; print counts, skips and masked examples",
        "draftheads data data.path=embedded data.show=3",
    ),
    "distill": Command(
        "draftheads.conf.commands.data:distill",
        a.DistillArgs,
        "regenerate answers with the target (resumable JSONL shards)",
        "draftheads distill data.max_rows=8 data.distill.out_dir=outputs/distill",
        {
            "decode.backend": "distill runs the target on data.distill.backend; use data.distill.backend={value}"
        },
    ),
    "features": Command(
        "draftheads.conf.commands.data:features",
        a.FeaturesArgs,
        "cache the target features a drafter trains on",
        f"draftheads features {EXAMPLE_DRAFT}",
    ),
    "train": Command(
        "draftheads.conf.commands.train:train",
        a.TrainArgs,
        "train a drafter on the frozen target",
        f"draftheads train {EXAMPLE_DRAFT} train.max_steps=500",
    ),
    "tree": Command(
        "draftheads.conf.commands.decode:tree",
        a.TreeArgs,
        "pick the best static tree for heads that index one by depth, from measured head accuracies",
        "draftheads tree heads=outputs/train",
        {
            "data": "tree measures on held-out prompts; set how many with decode.tree_prompts={value}",
            "decode.tree": "tree picks a new tree and does not read decode.tree; size it with "
            "decode.tree_size=N (0: from the cost curve), and pass decode.tree=FILE to generate or eval",
        },
    ),
    "generate": Command(
        "draftheads.conf.commands.decode:generate",
        a.GenerateArgs,
        "stream a speculative answer, then print tau and tokens/s",
        'draftheads generate heads=outputs/train prompt="Explain KV caches"',
        {"data": _PROMPT_HINT, "eval": _PROMPT_HINT},
    ),
    "eval": Command(
        "draftheads.conf.commands.decode:evaluate",
        a.EvalArgs,
        "acceptance (tau) and speedup on a prompt set, with baselines",
        "draftheads eval heads=outputs/train eval.prompts=heldout",
        {
            "data": "eval reads its prompts from eval.prompts; use eval.prompts={value}",
            "prompt": "eval reads its prompts from eval.prompts; use eval.prompts=FILE_OR_NAME",
        },
    ),
    "push": Command(
        "draftheads.conf.commands.heads:push",
        a.PushArgs,
        "upload a checkpoint with a model card to the Hugging Face Hub",
        "draftheads push heads=outputs/train repo_id=ORG/NAME",
    ),
    "export": Command(
        "draftheads.conf.commands.heads:export",
        a.ExportArgs,
        "export a checkpoint for vLLM or SGLang, or in vLLM's speculators format",
        "draftheads export heads=outputs/train format=vllm out_dir=outputs/vllm",
    ),
    "info": Command(
        "draftheads.conf.commands.heads:info",
        a.InfoArgs,
        "print a checkpoint's kind, shapes and target fingerprint; an export, a speculators or a z-lab "
        "directory is imported onto target= first",
        "draftheads info heads=outputs/train  |  draftheads info heads=outputs/vllm target=smollm2",
    ),
    "demo": Command(
        "draftheads.conf.commands.bench:demo",
        a.DemoArgs,
        "train, evaluate and stream on the embedded default at fixed sizes, no bench.* keys (make demo)",
        "draftheads demo",
        {
            "train": "demo sizes its training itself; use draftheads train for your own run",
            "bench": "demo runs fixed sizes into outputs/demo and reads no bench.* key; "
            "use `draftheads bench {key}={value}` for a sized run",
        },
    ),
    "bench": Command(
        "draftheads.conf.commands.bench:bench",
        a.BenchArgs,
        "the end-to-end benchmark (make bench)",
        "draftheads bench bench.out_dir=outputs/bench",
        {"train": "bench sizes training with bench.medusa_steps and bench.eagle_steps"},
    ),
    "speed": Command(
        "draftheads.conf.commands.bench:speed",
        a.SpeedArgs,
        "speculative vs plain greedy tokens/s per batch size",
        f"draftheads speed heads=outputs/bench/{EXAMPLE_FOLDER} speed.batch_sizes=[1,4]",
    ),
    "engine": Command(
        "draftheads.conf.commands.bench:engine",
        a.EngineArgs,
        "vLLM's acceptance beside draftheads' on the same prompts and chain (make engine first)",
        f"draftheads engine heads=outputs/demo/{EXAMPLE_FOLDER} engine.prompts=heldout engine.max_prompts=5",
        {
            "decode.tree": "engine runs one chain in both engines; set its length with engine.chain=K (e.g. engine.chain=3)",
            "decode.do_sample": "engine compares greedy decoding in both engines; drop decode.do_sample",
            "decode.temperature": "engine compares greedy decoding in both engines; drop decode.temperature",
            "format": "engine exports in engine.format (vllm or speculators; none: both); use engine.format={value}",
        },
    ),
    "train-speed": Command(
        "draftheads.conf.commands.bench:train_speed",
        a.TrainSpeedArgs,
        "training tokens/s of the bench recipe on a feature cache",
        f"draftheads train-speed speed.cache=outputs/bench/teacher {EXAMPLE_DRAFT}",
    ),
    "data-speed": Command(
        "draftheads.conf.commands.bench:data_speed",
        a.DataSpeedArgs,
        "tokenising, feature-extraction (speed.feature_tokens=0: none) and distillation "
        "(speed.distill_prompts=N; 0: none) tokens/s",
        "draftheads data-speed speed.feature_tokens=3000",
    ),
}

# The command line's one word for a location to write to, and the schema field it sets.
USER_NAMES = {"out": "out_dir", "eval.output_dir": "eval.out_dir", "train.output_dir": "train.out_dir"}
SCHEMA_NAMES = {user: schema for schema, user in USER_NAMES.items()}
OLD_SPELLINGS = {**USER_NAMES, "output_dir": "out_dir", "out": "out_dir"}
