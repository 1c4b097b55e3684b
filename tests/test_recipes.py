"""Recipes for real targets (``conf/recipe/``): every one's dry run trains two steps on a tiny
model of its family and prints the real run's needs, which match the hand-computed figures; a
real run asking for more GPUs than there are is refused in one line."""

from __future__ import annotations

import io
import math
import re
from contextlib import redirect_stderr, redirect_stdout

import pytest

from draftheads.conf.cli import main, parse
from draftheads.conf.commands.compose import group_options
from draftheads.train.devices import devices_problem

RECIPES = group_options("recipe")
GIB = 2**30
# one worker runs every test here, so each recipe's dry run (seconds each) runs once
pytestmark = pytest.mark.xdist_group("recipes")


@pytest.fixture(scope="module")
def dry_run():
    """``recipe -> (exit code, stdout)`` of its dry run, each run once in this process."""
    done: dict[str, tuple[int, str]] = {}

    def run(name: str) -> tuple[int, str]:
        if name not in done:
            out = io.StringIO()
            with redirect_stdout(out):
                code = main(["train", f"recipe={name}", "train.dry_run=true"])
            done[name] = code, out.getvalue()
        return done[name]

    return run


def figure(text: str, label: str) -> float:
    """The number printed after ``label`` (commas dropped)."""
    m = re.search(rf"^\s+{re.escape(label)}\s+([\d,.]+)", text, re.M)
    assert m, f"no {label!r} line in:\n{text}"
    return float(m.group(1).replace(",", ""))


def test_the_recipes_are_the_seven_real_targets():
    assert RECIPES == [
        "gpt-oss-20b-eagle3",
        "llama3.1-8b-dflash",
        "llama3.1-8b-eagle3",
        "llama3.3-70b-eagle3-offline",
        "qwen3-30b-a3b-eagle3",
        "qwen3-8b-dflash",
        "qwen3-8b-eagle3",
    ]


@pytest.mark.parametrize("name", RECIPES)
def test_dry_run_trains_two_steps_and_sizes_the_real_run(dry_run, name):
    code, text = dry_run(name)
    assert code == 0, text
    m = re.search(r"2 optimizer steps on a tiny (\S+) .*: loss ([\d.]+) -> ([\d.]+)$", text, re.M)
    assert m, text
    cfg = parse(["train", f"recipe={name}"]).args
    assert m.group(1) == cfg.recipe.shape.model_type
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in m.group(2, 3))
    trainable = figure(text, "trainable parameters")
    assert 0 < trainable <= figure(text, "drafter parameters") < figure(text, "target parameters")
    for label in (
        "optimizer states per rank",
        "activations per rank",
        "target weights per rank",
        "FLOPs per token",
    ):
        assert figure(text, label) > 0, label
    assert ("feature cache on disk" in text) == (cfg.train.features == "offline")


def test_moe_recipes_size_every_expert_in_memory_and_the_routed_ones_in_flops(dry_run):
    """Qwen3-30B-A3B holds 30.5B weights but runs about 3.3B a token; gpt-oss-20b 20.9B and 3.6B."""
    for name, total, active in (
        ("qwen3-30b-a3b-eagle3", 30.5e9, 3.3e9),
        ("gpt-oss-20b-eagle3", 20.9e9, 3.6e9),
    ):
        code, text = dry_run(name)
        assert code == 0, text
        assert abs(figure(text, "target parameters") - total) < 0.05e9
        target_gflop = float(re.search(r"target forward ([\d.]+)\)", text).group(1))
        assert 2 * active / 1e9 < target_gflop < 2 * active / 1e9 * 1.25  # 2 x active, plus attention


def test_llama_eagle3_figures_equal_the_hand_computed_ones(dry_run):
    """Llama-3.1-8B-Instruct's shape: H 4096, 32 layers, 32 heads of 128, 8 KV heads, MLP M 14336,
    vocab 128256; EAGLE-3 with a 32k draft vocabulary, 8 ranks, ZeRO-2, bf16, 2048-token rows."""
    _, text = dry_run("llama3.1-8b-eagle3")
    H, L, A, KV, M, V, Vd, S = 4096, 32, 32 * 128, 8 * 128, 14336, 128256, 32000, 2048
    layer = H * A + 2 * H * KV + A * H + 3 * H * M + 2 * H  # q, k, v, o, gate/up/down, two norms
    target = V * H + L * layer + H + V * H  # embedding, layers, final norm, lm_head
    assert target == 8_030_261_248  # the published parameter count
    drafter = (
        3 * H * H  # fc over three target layers
        + 2 * H * A + 2 * (2 * H * KV) + A * H  # q, k, v read concat(embedding, feature), o
        + 3 * H * M + 2 * H  # MLP, two layer norms
        + 2 * H  # hidden_norm, norm
        + H * Vd  # lm_head over the draft vocabulary
    )  # fmt: skip
    assert figure(text, "target parameters") == target
    assert figure(text, "drafter parameters") == drafter
    assert figure(text, "trainable parameters") == drafter
    assert figure(text, "optimizer states per rank") == round(12 * drafter / 8 / GIB, 2)
    assert figure(text, "weights + grads per rank") == round((2 * drafter + 2 * drafter / 8) / GIB, 2)
    assert figure(text, "target weights per rank") == round(2 * target / GIB, 2)
    target_forward = 2 * (target - 2 * V * H) + 2 * L * S * A + 2 * H * V  # layers, attention, lm_head
    assert f"target forward {target_forward / 1e9:.2f})" in text
    assert "vLLM and SGLang serve EAGLE-3 drafters of one decoder layer; this one has 1" in text


def test_sharded_recipe_spreads_the_target_and_keeps_one_rank(dry_run):
    _, text = dry_run("llama3.3-70b-eagle3-offline")
    assert "one process, the target over 8 GPUs (target.device_map=auto)" in text
    assert figure(text, "target parameters") == 70_553_706_496
    assert figure(text, "target weights per rank") == round(2 * 70_553_706_496 / 8 / GIB, 2)
    assert "target forward 0.00" in text  # offline: the target ran once, when the cache was built
    assert figure(text, "feature cache on disk") == round((4 * 8192 * 2 + 64 * 8) / 1024, 1)


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def test_a_real_run_without_its_gpus_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    code, err = run_cli(["train", "recipe=llama3.1-8b-eagle3"])
    assert code == 1
    assert err.count("\n") == 1 and "recipe=llama3.1-8b-eagle3 needs 8 GPUs (recipe.devices)" in err
    assert "torchrun --nproc_per_node=8 --no-python draftheads train recipe=llama3.1-8b-eagle3" in err


def test_devices_are_counted_per_process_or_for_the_sharded_target():
    assert devices_problem("r", 8, sharded=False, world=8, gpus=8) is None
    assert devices_problem("r", 8, sharded=False, world=16, gpus=8, nodes=2) is None
    assert "1 process(es) over 8 GPU(s)" in devices_problem("r", 8, sharded=False, world=1, gpus=8)
    assert "8 process(es) over 0 GPU(s)" in devices_problem("r", 8, sharded=False, world=8, gpus=0)
    assert devices_problem("r", 8, sharded=True, world=1, gpus=8) is None
    assert "4 GPU(s) visible" in devices_problem("r", 8, sharded=True, world=1, gpus=4)


@pytest.mark.parametrize(
    "argv,line",
    [
        (
            ["train", "train.dry_run=true"],
            "train.dry_run=true sizes a real run from recipe.shape, and none is set",
        ),
        (["train", "recipe=qwen3-8b-eagle3", "recipe.shape.vocab_size=0"], "recipe.shape lacks vocab_size"),
        (["train", "recipe=qwen3-8b-eagle3", "recipe.devices=0"], "recipe.devices=0 is out of range"),
        (["train", "recipe=qwen3-8b-eagle4"], "recipe=qwen3-8b-eagle4 is not a recipe option"),
        (
            ["train", "recipe=llama3.1-8b-dflash", "recipe.shape.num_hidden_layers=24", "train.dry_run=true"],
            "ids must be in 1..23",
        ),
        (
            ["train", "recipe=llama3.1-8b-eagle3", "train.dry_run=true", "recipe.shape.hidden_size=100"],
            "recipe.shape does not make a llama config (ValueError: The hidden size (100) is not a multiple",
        ),
        (
            [
                "train",
                "recipe=llama3.1-8b-eagle3",
                "train.dry_run=true",
                "recipe.shape.hidden_size=100",
                "recipe.shape.head_dim=null",
            ],
            "recipe.shape.hidden_size=100 is not a multiple of recipe.shape.num_attention_heads=32",
        ),
        (
            ["train", "recipe=llama3.1-8b-eagle3", "train.dry_run=true", "draft.eagle.num_decoder_layers=40"],
            "draft.eagle.num_decoder_layers=40 is more than the target's 32 layers",
        ),
    ],
    ids=[
        "no-shape",
        "half-shape",
        "no-devices",
        "unknown",
        "layers-beyond-the-shape",
        "hidden-size",
        "hidden-size-no-head-dim",
        "deeper-than-the-target",
    ],
)
def test_bad_recipe_input_is_one_line(argv, line):
    code, err = run_cli(argv)
    assert code == 1 and err.count("\n") == 1 and line in err, err


@pytest.mark.parametrize("command", ["distill", "features", "eval"])
def test_the_other_steps_of_a_recipe_read_its_target(command):
    extra = ["heads=outputs/x"] if command == "eval" else []
    args = parse([command, "recipe=llama3.3-70b-eagle3-offline", *extra]).args
    assert args.target.name_or_path == "meta-llama/Llama-3.3-70B-Instruct"
    assert args.target.device_map == "auto" and args.target.dtype == "bfloat16"


@pytest.mark.parametrize("name", ["qwen3-8b-eagle3", "qwen3-30b-a3b-eagle3", "gpt-oss-20b-eagle3"])
def test_the_eagle3_recipes_drafters_at_their_real_shape_pass_the_engines_loader_rules(name):
    """The drafter each recipe trains (built at the real target's shape on the meta device) is
    what vLLM's and SGLang's EAGLE-3 loaders read: a Llama layer of the target's width, config and
    tensors as they build them; speculators' layout is made from the vLLM one."""
    from draftheads.heads.eagle.export import export_eagle3
    from draftheads.heads.engine.loaders import config_problems, format_of, tensor_problems
    from draftheads.train.dry_run.sizing import meta_drafter

    cfg = parse(["train", f"recipe={name}"]).args
    drafter = meta_drafter(cfg.draft, cfg.recipe.shape, cfg.target.name_or_path)
    assert drafter.layer_config.model_type == "llama" and drafter.layer_config.hidden_act == "silu"
    for engine in ("vllm", "sglang"):
        config, tensors = export_eagle3(drafter, engine)
        fmt = format_of(config, engine)
        assert config_problems(config, fmt, cfg.recipe.shape.num_hidden_layers) == []
        assert tensor_problems(tensors, fmt.tensors(config)) == [], engine
    assert config["hidden_size"] == cfg.recipe.shape.hidden_size
