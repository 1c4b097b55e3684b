"""The whole typed config: one dataclass per Hydra group, composed into :class:`Config`.

Config flows one way: Hydra composes ``conf/config.yaml`` and the group files, OmegaConf
checks every key and type against these dataclasses, and ``OmegaConf.to_object`` turns
the result into plain dataclass objects that the commands read. Nothing is global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftheads.conf.errors import UserError
from draftheads.conf.schema.bench_drafters import BENCH_DRAFTERS, default_drafters
from draftheads.conf.schema.checks import at_least, positive
from draftheads.conf.schema.data import DataConfig
from draftheads.conf.schema.decode import DecodeConfig, EvalConfig, check_prompt_source
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from draftheads.conf.schema.recipe import RecipeConfig
from draftheads.conf.schema.train import LoggerConfig, TrainConfig

# The drafters the bench trains are registered in bench_drafters.py; the baselines it can run:
BENCH_BASELINES = ("pld",)


@dataclass
class BenchConfig:
    """``draftheads bench`` / ``draftheads demo``: the end-to-end pipeline on the embedded target.

    Stages cache their outputs under ``out_dir`` (distilled data, features, drafters, reports),
    so a rerun skips what is done and continues an interrupted training run from its last
    checkpoint (``save_every``). ``shared_data`` is the optional data folder (Spec-Bench, GSM8K,
    CodeAlpaca); absent, those sets are skipped with a message.

    With ``teacher_tokens > 0`` the drafters train on teacher-forced text (``data=teacher``: the
    embedded components, GSM8K and CodeAlpaca when present), labelled by the target's
    top-``topk`` logits; the streamed drafters (``BenchDrafter.streamed``) read that cache from
    disk. With ``distill_prompts > 0`` as well, the distilled answers get a cache of their own and
    the streamed drafters train on both, the distilled part ``distill_repeats`` times (a mixture;
    the others, the scaling points and the ablations stay on the teacher-forced cache). The embedded
    components alone hold about 350k answer tokens; 500k needs GSM8K or CodeAlpaca in
    ``shared_data`` (1.47M with both).

    ``drafters`` defaults to the bench rows their records mark ``default``, trained side by side
    (the streamed ones on the same data and passes), so that they are reported together; list
    fewer where the run must fit in two hours on a slower CPU. ``drafter_only`` measures
    each drafter's held-out τ once more with its own tree alone: what the drafter learnt, apart
    from the lookup branch and the planner.

    ``published_tree=true`` adds a row per prompt set: the lead drafter (``BenchDrafter.lead``)
    verified with the published dynamic tree of Li et al. (2024) (top-10 expansions, depth 6, 60
    nodes, every one verified, the decoder's lookup branch as configured), the tree their τ figures
    are measured with. On a CPU such a step costs several greedy steps, so it measures τ, not a
    faster setting.

    ``scaling_tokens``, ``ablations`` and ``variants`` are the maintainers' study, run from a
    checkout with ``python -m bench.lab.study`` (the installed bench refuses them): each point or
    row costs up to a main run, so they are off by default and a rerun adds them (cached stages
    only add what is new). Each stage's minutes on the reference CPUs are in docs/training.md
    ("Stage times of make bench"), the study's in docs/ablations.md.
    """

    out_dir: str = "outputs/bench"
    shared_data: str = "../shared/data"
    # distillation: prompts answered greedily by the target (embedded train split, plus GSM8K
    # train and CodeAlpaca when shared_data exists), and target-written prompts
    distill_prompts: int = 960
    self_prompts: int = 0
    # beside teacher-forced data: passes over the distilled answers per pass over the teacher text
    distill_repeats: int = 1
    distill_new_tokens: int = 160
    distill_batch_size: int = 32
    # teacher-forced answer tokens in the feature cache (0: train on the distilled data only)
    teacher_tokens: int = 500_000
    topk: int = 64
    shard_mb: float = 64.0
    save_every: int = 200
    drafters: list[str] = field(default_factory=default_drafters)
    medusa_steps: int = 150
    medusa_tokens: int = 68_000
    eagle_steps: int = 1500
    # tau against distinct answer tokens at equal compute (answer tokens x epochs = scaling_compute);
    # without teacher data: tau against training tokens, each point a fresh run on a subset
    scaling_tokens: list[int] = field(default_factory=list)
    scaling_compute: int = 500_000
    scaling_steps_per_10k_tokens: int = 40
    # recipe switches at equal data (rows of ABLATIONS in bench/lab/ablation_rows.py, or [all])
    ablations: list[str] = field(default_factory=list)
    ablation_tokens: int = 68_000
    ablation_epochs: float = 1.0
    # rows of the same table trained on the main drafters' own data and passes, each measured
    # drafter only (bench/lab/variants.py): levers at full data (names of ABLATIONS rows)
    variants: list[str] = field(default_factory=list)
    eval_sets: list[str] = field(default_factory=lambda: ["heldout", "spec_bench", "gsm8k_test"])
    eval_prompts: int = 20
    spec_bench_per_category: int = 1
    eval_new_tokens: int = 128
    # run once, with the first drafter (they do not depend on the drafter)
    baselines: list[str] = field(default_factory=lambda: ["pld"])
    # also evaluate the lead drafter with the published dynamic tree (Li et al., 2024; 60 nodes, no
    # cost-aware pruning)
    published_tree: bool = False
    # with heldout in eval_sets: every drafter's held-out τ once more with its own tree alone (no
    # lookup branch, no cost-aware planning), as the ablation rows' "drafter only": what it learnt
    drafter_only: bool = True
    # the lead drafter beyond batch 1 (batches 1/4/8, the long and copy sets with prompt lookup
    # beside them) and on its first call, as ``draftheads speed speed.workloads=true`` measures
    workloads: bool = True
    docs: str = "docs/benchmarks.md"

    def __post_init__(self) -> None:
        """Refuse, when the config is read, values no stage can run (sizes, names, an empty
        ``out_dir``); the folders themselves are checked by the command before the first stage.
        ``distill_prompts``, ``self_prompts`` and ``teacher_tokens`` take 0 for "none", and
        ``eval_sets=[]`` evaluates nothing (a run for its training, scaling or ablation rows)."""
        self.check_sizes()
        self.check_names()

    def check_sizes(self) -> None:
        """Counts and sizes: each at least what its stage needs, and something to train on."""
        if not str(self.out_dir or "").strip():
            raise UserError(
                "bench.out_dir is empty; give the bench's folder, e.g. bench.out_dir=outputs/bench"
            )
        for key, low, example in (
            ("distill_prompts", 0, "960 (0: no distillation)"),
            ("self_prompts", 0, "0 (none)"),
            ("distill_repeats", 1, 1),
            ("distill_new_tokens", 1, 160),
            ("distill_batch_size", 1, 32),
            ("teacher_tokens", 0, "500000 (0: none)"),
            ("topk", 0, 64),
            ("save_every", 0, "200 (0: never)"),
            ("medusa_steps", 1, 150),
            ("medusa_tokens", 1, 68000),
            ("eagle_steps", 1, 1500),
            ("scaling_compute", 1, 500000),
            ("scaling_steps_per_10k_tokens", 1, 40),
            ("ablation_tokens", 1, 68000),
            ("eval_prompts", 1, 20),
            ("spec_bench_per_category", 1, 1),
            ("eval_new_tokens", 1, 128),
        ):
            at_least(f"bench.{key}", getattr(self, key), low, example)
        positive("bench.shard_mb", self.shard_mb, 64)
        positive("bench.ablation_epochs", self.ablation_epochs, 1.0)
        if not self.distill_prompts and not self.teacher_tokens:
            raise UserError(
                "bench.distill_prompts=0 and bench.teacher_tokens=0 leave nothing to train on; "
                "use bench.distill_prompts=960 or bench.teacher_tokens=500000"
            )
        if any(n < 1 for n in self.scaling_tokens):
            raise UserError(
                f"bench.scaling_tokens={list(self.scaling_tokens)} has a point below 1 token; "
                "use e.g. bench.scaling_tokens=[68000,150000]"
            )

    def check_names(self) -> None:
        """Drafters, prompt sets and baselines the stages know (a drafter at least, none twice)."""
        drafters = list(self.drafters)
        bad = [k for k in drafters if k not in BENCH_DRAFTERS]
        if not drafters or bad or len(set(drafters)) != len(drafters):
            why = "trains nothing" if not drafters else f"names unknown {bad}" if bad else "names one twice"
            raise UserError(
                f"bench.drafters={drafters} {why}; list some of {', '.join(BENCH_DRAFTERS)} once each "
                f"(e.g. bench.drafters=[{','.join(default_drafters()[:2])}])"
            )
        for name in self.eval_sets:
            try:
                check_prompt_source("bench.eval_sets", name)
            except UserError:
                raise UserError(
                    f"bench.eval_sets has {name!r}, not a prompt set, file or dataset id ORG/NAME; "
                    "use e.g. bench.eval_sets=[heldout,spec_bench,gsm8k_test]"
                ) from None
        bad = [n for n in self.baselines if n not in BENCH_BASELINES]
        if bad:
            raise UserError(
                f"bench.baselines has {bad}; the bench runs {', '.join(BENCH_BASELINES)} "
                "(e.g. bench.baselines=[pld], or bench.baselines=[] for none)"
            )


@dataclass
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: dict[str, Any] = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    # Command arguments (which command reads which is listed in `draftheads --help`).
    heads: str | None = None
    revision: str | None = None
    prompt: str | None = None
    repo_id: str | None = None
    private: bool = False
    format: str | None = None
    out: str | None = None
    verifier: str | None = None


def register() -> None:
    """Make the schema known to Hydra as ``base_config`` (idempotent).

    ``data.fields`` and ``eval.fields`` map field names to columns, so their nodes stay open to
    new keys: ``data.fields.text=body`` works without Hydra's ``+`` (the dataclasses check the
    names).
    """
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    if "base_config.yaml" in store.repo:  # building the node is a sixth of a compose's time
        return
    node = OmegaConf.structured(Config)
    OmegaConf.set_struct(node.data.fields, False)
    OmegaConf.set_struct(node.eval.fields, False)
    store.store(name="base_config", node=node)
