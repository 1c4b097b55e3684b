"""The pipeline's commands, called with a composed config (as the CLI calls them)."""

from __future__ import annotations

import json

import pytest

from draftheads.conf.cli import compose
from draftheads.conf.errors import UserError
from draftheads.data import commands
from draftheads.data.cache import FeatureCache


def cfg_of(*overrides: str):
    return compose(["target=tiny-llama", *overrides])[0]


def test_data_prints_counts_reasons_and_marked_examples(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]})
        + "\n"
        + json.dumps({"conversations": [{"from": "robot", "value": "x"}]})
        + "\n"
    )
    commands.data(cfg_of(f"data.path={path}", "data.show=1", "data.min_loss_tokens=1"))
    out = capsys.readouterr().out
    assert "sharegpt" in out and "total: 1 rows" in out and "unknown role 'robot'" in out
    assert "<|im_start|>assistant\n\u27e6Hello!<|im_end|>\u27e7\n" in out
    body = out.split("---\n", 1)[1]
    assert body.count("\u27e6") == 1 and body.startswith("<|im_start|>system\n")  # nothing else trained


def test_data_reports_each_mixture_component(tmp_path, capsys):
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps({"text": f"row {i} text"}) + "\n" for i in range(4)))
    mix = f"data.mixture=[{{path:{a},weight:1,name:plain}},{{path:embedded:humaneval,weight:1,max_rows:4}}]"
    commands.data(cfg_of(mix))
    out = capsys.readouterr().out
    assert "plain" in out and "embedded:humaneval" in out and "total: 8 rows" in out


def test_features_command_builds_the_cache_the_drafter_reads(tmp_path, capsys):
    out = tmp_path / "f"
    cfg = cfg_of(
        "draft=eagle3",
        "data.path=embedded:humaneval",
        "data.max_rows=3",
        f"data.features.out_dir={out}",
        "data.features.target_next=true",
    )
    commands.features(cfg)
    cache = FeatureCache(out, layers=commands.drafter_layers(cfg, 4))
    # EAGLE-3 reads three layers and trains against the final state: the trainer's layer list
    assert cache.layers == [2, 2, 1, 4]
    assert len(cache) == 3 and cache[0]["features"].shape[1] == 4 * 64 and "target_next" in cache[0]
    with pytest.raises(UserError, match="needs unpacked rows"):
        commands.features(cfg_of("data.packing=true"))


def test_distill_command_answers_data_prompts_then_trains_on_them(tmp_path, capsys):
    src = tmp_path / "q.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    commands.distill(
        cfg_of(
            f"data.path={src}",
            f"data.distill.out_dir={out}",
            "data.distill.max_new_tokens=4",
            "data.distill.batch_size=2",
        )
    )
    assert "distilled 3 prompts" in capsys.readouterr().out
    commands.data(cfg_of(f"data.path={out}", "data.min_loss_tokens=1"))
    assert "total: 3 rows" in capsys.readouterr().out
    with pytest.raises(UserError, match="data.distill.source=web is unknown"):
        commands.distill(cfg_of("data.distill.source=web"))
