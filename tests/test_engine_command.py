"""``draftheads engine`` refuses, in one line and before any engine starts, what it cannot run:
vLLM missing (naming ``make engine``), a drafter vLLM's CPU build cannot serve, an unknown
prompt set, a count below 1. No vLLM is needed here: each refusal comes before it would start
(tests/test_engine.py runs the command on vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftheads.bench.engine_acceptance import count_steps, mean_acceptance_length
from draftheads.conf.cli import main
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from tests.test_bad_input import one_line_error, snapshot


def saved_target(folder: Path, heads: int) -> Path:
    """A tiny random Llama of width 64 with ``heads`` attention heads, saved as vLLM loads one."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftheads.heads.target.load import load_tokenizer

    tok = load_tokenizer(TargetConfig(name_or_path="tiny-llama", tiny="llama"))
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=heads,
        num_key_value_heads=1,
        vocab_size=len(tok),
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def saved_eagle3(target: Path, out: Path) -> Path:
    """An untrained EAGLE-3 drafter for the target in ``target``, saved in ``out``."""
    from draftheads.heads.target.load import load_target
    from draftheads.train.drafters import build_drafter

    cfg = Config(target=TargetConfig(name_or_path=str(target)), draft=DraftConfig.of(kind="eagle", version=3))
    model, tok = load_target(cfg.target)
    build_drafter(cfg, model, tok).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def servable(tmp_path_factory) -> tuple[Path, Path]:
    """(target folder, drafter folder): head size 32, what vLLM's CPU build serves."""
    root = tmp_path_factory.mktemp("servable")
    target = saved_target(root / "target", heads=2)
    return target, saved_eagle3(target, root / "eagle3")


@pytest.fixture(scope="module")
def too_small(tmp_path_factory) -> tuple[Path, Path]:
    """(target folder, drafter folder): head size 16, below what vLLM's CPU build serves."""
    root = tmp_path_factory.mktemp("small")
    target = saved_target(root / "target", heads=4)
    return target, saved_eagle3(target, root / "eagle3")


def refused(argv: list[str], capsys, root: Path) -> str:
    """The one ``error:`` line ``draftheads engine argv`` prints; nothing under ``root`` changes."""
    before = snapshot(root)
    assert main(["engine", *argv]) == 1
    line = one_line_error(capsys)
    assert snapshot(root) == before
    return line


def test_missing_vllm_is_one_line_naming_make_engine(servable, tmp_path, monkeypatch, capsys):
    target, heads = servable
    monkeypatch.setenv("DRAFTHEADS_ENGINE_PYTHON", str(tmp_path / "no-engine" / "python"))
    out = tmp_path / "record.json"
    argv = [f"heads={heads}", f"target.name_or_path={target}", "engine.max_prompts=2", f"engine.out={out}"]
    line = refused(argv, capsys, tmp_path)
    assert "vLLM is not installed" in line and "make engine" in line and "no-engine" in line
    assert not out.exists()


def test_a_python_without_vllm_is_one_line_naming_make_engine(servable, tmp_path, monkeypatch, capsys):
    import sys

    target, heads = servable
    monkeypatch.setenv("DRAFTHEADS_ENGINE_PYTHON", sys.executable)  # draftheads' venv: no vLLM
    line = refused([f"heads={heads}", f"target.name_or_path={target}"], capsys, tmp_path)
    assert "vLLM does not import" in line and "make engine" in line


def test_a_head_size_below_32_is_refused_before_the_engine(too_small, tmp_path, monkeypatch, capsys):
    target, heads = too_small
    monkeypatch.setenv("DRAFTHEADS_ENGINE_PYTHON", str(tmp_path / "no-engine" / "python"))
    line = refused([f"heads={heads}", f"target.name_or_path={target}"], capsys, tmp_path)
    assert "head size is 16" in line and "at least 32" in line


@pytest.mark.parametrize(
    "override,needle",
    [
        ("engine.prompts=nope", "engine.prompts=nope is unknown; use one of heldout"),
        ("engine.max_prompts=0", "engine.max_prompts=0 is out of range; use a value >= 1"),
        ("decode.max_new_tokens=0", "decode.max_new_tokens=0"),
        ("engine.chain=0", "engine.chain=0 is out of range"),
        ("engine.format=sglang", "engine.format=sglang is unknown; use one of vllm, speculators"),
        ("decode.tree=chain4", "set its length with engine.chain=K"),
    ],
)
def test_bad_settings_are_one_line_before_anything_loads(override, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert needle in refused(["heads=h", override], capsys, tmp_path)


def test_heads_are_required(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert "draftheads engine needs heads=DIR" in refused(["engine.max_prompts=1"], capsys, tmp_path)


def test_steps_are_counted_as_vllm_counts_them():
    """Each step until the prompt has its tokens (the prefill writes the first), all it accepted:
    a step that overshoots counts whole, the steps after it not at all."""
    assert count_steps([3, 0, 2, 3, 1], new_tokens=8) == [3, 0, 2]
    assert count_steps([1, 1], new_tokens=1) == []
    assert mean_acceptance_length({"num_drafts": 4, "num_accepted_tokens": 6}) == 2.5
    assert mean_acceptance_length({"num_drafts": 0, "num_accepted_tokens": 0}) == 1.0


@pytest.mark.parametrize(
    "given,used", [([], "eager"), (["decode.backend=auto"], "eager"), (["decode.backend=onednn"], "onednn")]
)
def test_draftheads_side_skips_the_backend_timing_unless_a_backend_is_named(given, used):
    from draftheads.conf.cli import parse

    assert parse(["engine", "heads=h", *given]).args.decode.backend == used
