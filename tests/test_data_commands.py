"""The data pipeline's commands, called with the typed arguments the CLI parses."""

from __future__ import annotations

import json

import pytest

from draftheads.conf.cli import parse
from draftheads.conf.commands import data as commands
from draftheads.conf.errors import UserError
from draftheads.data.cache.read import FeatureCache


def args_of(command: str, *overrides: str):
    """The command's typed arguments, parsed as the command line parses them."""
    return parse([command, "target=tiny-llama", *overrides]).args


def test_data_prints_counts_reasons_and_marked_examples(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]})
        + "\n"
        + json.dumps({"conversations": [{"from": "robot", "value": "x"}]})
        + "\n"
    )
    commands.data(args_of("data", f"data.path={path}", "data.show=1", "data.min_loss_tokens=1"))
    out = capsys.readouterr().out
    assert "sharegpt" in out and "total: 1 rows" in out and "unknown role 'robot'" in out
    assert "<|im_start|>assistant\n\u27e6Hello!<|im_end|>\u27e7\n" in out
    body = out.split("---\n", 1)[1]
    assert body.count("\u27e6") == 1 and body.startswith("<|im_start|>system\n")  # nothing else trained


def test_data_reports_each_mixture_component(tmp_path, capsys):
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps({"text": f"row {i} text"}) + "\n" for i in range(4)))
    mix = f"data.mixture=[{{path:{a},weight:1,name:plain}},{{path:embedded:humaneval,weight:1,max_rows:4}}]"
    commands.data(args_of("data", mix))
    out = capsys.readouterr().out
    assert "plain" in out and "embedded:humaneval" in out and "total: 8 rows" in out


def test_features_command_builds_the_cache_the_drafter_reads(tmp_path, capsys):
    out = tmp_path / "f"
    cfg = args_of(
        "features",
        "draft=eagle3",
        "data.path=embedded:humaneval",
        "data.max_rows=3",
        f"data.features.out_dir={out}",
        "data.features.target_next=true",
    )
    commands.features(cfg)
    cache = FeatureCache(out, layers=commands.drafter_layers(cfg, 4))
    # EAGLE-3 reads three layers and trains against the final state: the trainer's layer list
    assert cache.layers == [1, 2, 3, 4]
    assert len(cache) == 3 and cache[0]["features"].shape[1] == 4 * 64 and "target_next" in cache[0]
    with pytest.raises(UserError, match="needs unpacked rows"):
        commands.features(args_of("features", "data.packing=true"))


def test_distill_command_answers_data_prompts_then_trains_on_them(tmp_path, capsys):
    src = tmp_path / "q.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    commands.distill(
        args_of(
            "distill",
            f"data.path={src}",
            f"data.distill.out_dir={out}",
            "data.distill.max_new_tokens=4",
            "data.distill.batch_size=2",
        )
    )
    assert "distilled 3 prompts" in capsys.readouterr().out
    commands.data(args_of("data", f"data.path={out}", "data.min_loss_tokens=1"))
    assert "total: 3 rows" in capsys.readouterr().out
    with pytest.raises(UserError, match="data.distill.source=web is unknown"):
        commands.distill(args_of("distill", "data.distill.source=web"))
