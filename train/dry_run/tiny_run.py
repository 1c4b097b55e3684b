"""The dry run's tiny stand-in: the recipe's drafter, objective and DeepSpeed config trained for
two optimizer steps on a random model of the target's family at toy widths.

The stand-in keeps the target's ``model_type`` (so the family's own classes run) at hidden 64,
with the embedded tokenizer; it trains in this one process (gloo on a CPU), on a few rows of
the embedded set, through an offline feature cache when the recipe reads one, and into a
temporary folder the dry run gives it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from draftheads.conf.schema import Config
from draftheads.conf.schema.data import DataConfig
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from draftheads.conf.schema.recipe import TargetShape
from draftheads.conf.schema.tiny import TINY_CONFIGS
from draftheads.conf.schema.train import LoggerConfig

# the tiny stand-in: the family's own classes at toy widths (the tested families' tiny configs, with
# their experts and windows; these widths for any other)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
# rows per embedded component, their length, and a block drafter's anchors (blocks) per row in the tiny run
TINY_ROWS, TINY_LENGTH, TINY_ANCHORS = 8, 128, 8


def tiny_layers(d: DraftConfig) -> tuple[int, list[int] | None]:
    """(layers of the tiny target, the drafter's feature layers on it): the recipe's number of
    feature layers, as the first ones, and at least 4 layers (a default of three distinct feature
    layers needs them) and the drafter's depth + 3 (a default of one feature layer per drafter
    layer needs them, and no drafter may be deeper than its target), whatever the kind (a kind
    without decoder layers has neither key)."""
    feature_layers = getattr(d.section, "feature_layers", None)
    if not feature_layers:
        return max(4, getattr(d.section, "num_decoder_layers", 1) + 3), None
    k = len(feature_layers)
    return max(4, k + 1), list(range(1, k + 1))


def save_tiny_target(shape: TargetShape, layers: int, out: Path, seed: int) -> None:
    """A random-init model of the recipe's family at toy widths, with the embedded tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftheads.heads.target.load import load_tokenizer

    tok = load_tokenizer(TargetConfig(name_or_path="smollm2"))
    special = {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    family = {k: v for k, v in TINY_CONFIGS.get(shape.model_type, TINY).items() if k != "model_type"}
    if len(family.get("layer_types") or [None] * layers) != layers:  # the family's pattern, at this depth
        family.pop("layer_types")
    config = AutoConfig.for_model(
        shape.model_type,
        **{**family, "num_hidden_layers": layers},
        vocab_size=len(tok),
        tie_word_embeddings=False,
        **special,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def tiny_config(cfg: Config, tmp: Path) -> Config:
    """The recipe's config with a tiny target, a few embedded rows and two steps into ``tmp``."""
    layers, feature_layers = tiny_layers(cfg.draft)
    save_tiny_target(cfg.recipe.shape, layers, tmp / "target", cfg.train.seed)
    target = TargetConfig(
        name_or_path=str(tmp / "target"),
        dtype=cfg.target.dtype,
        attn_implementation=cfg.target.attn_implementation,
        device_map=cfg.target.device_map if isinstance(cfg.target.device_map, str) else None,
    )
    section = cfg.draft.section
    small = {  # of these keys, those the kind's section has
        "feature_layers": feature_layers,
        "mask_token_id": None,
        "anchors_per_row": min(getattr(section, "anchors_per_row", 0), TINY_ANCHORS),
    }
    keys = {f.name for f in dataclasses.fields(section)}
    section = dataclasses.replace(section, **{k: v for k, v in small.items() if k in keys})
    draft = dataclasses.replace(cfg.draft, **{cfg.draft.kind: section})
    features = dataclasses.replace(cfg.data.features, out_dir=str(tmp / "features"))
    data = DataConfig(path="embedded", max_length=TINY_LENGTH, max_rows=TINY_ROWS, features=features)
    train = dataclasses.replace(
        cfg.train,
        output_dir=str(tmp / "train"),
        max_steps=2,
        epochs=None,
        stop_at=None,
        warmup_steps=0,
        eval_every=2,
        eval_rows=2,
        save_every=0,
        log_every=1,
        resume="none",
        rows=None,
        progress=False,
        dry_run=False,
        feature_cache=str(tmp / "features") if cfg.train.features == "offline" else None,
    )
    return Config(
        target=target, draft=draft, data=data, train=train, deepspeed=cfg.deepspeed, logger=LoggerConfig()
    )


def build_tiny_cache(cfg: Config) -> None:
    """The offline feature cache of the tiny run, as ``draftheads features`` writes it."""
    from draftheads.data.cache.build import build_feature_cache
    from draftheads.data.prepare import prepare_dataset
    from draftheads.heads.target.layers import decoder_layers
    from draftheads.heads.target.load import load_target

    f = cfg.data.features
    model, tok = load_target(cfg.target)
    ds, _ = prepare_dataset(cfg.data, tok, "train")
    layers = cfg.draft.training_layers(len(decoder_layers(model)))
    build_feature_cache(
        model, tok, ds, f.out_dir, layers, dtype=f.dtype, batch_tokens=f.batch_tokens,
        target_next=f.target_next, topk=f.topk, shard_mb=f.shard_mb, show_progress=False,
    )  # fmt: skip


def tiny_losses(cfg: Config, train: Callable[[Config], Any]) -> list[float]:
    """Train the tiny stand-in (through its feature cache when the recipe is offline); the losses."""
    from draftheads.train.metrics import read_metrics

    if cfg.train.features == "offline":
        build_tiny_cache(cfg)
    out = train(cfg)
    return [float(row["loss"]) for row in read_metrics(out) if "loss" in row]
