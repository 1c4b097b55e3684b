"""Stages 3 and 4 of the bench: a drafter trained on cached rows, and the static tree chosen for it.

Each drafter in ``bench.drafters`` is trained on the cached features with the bench's recipe for
its kind (:func:`stage_train`, also the trainer of the scaling points); a drafter whose tree
stage picks a static tree (``BenchDrafter.tree``) then gets the tree ``draftheads tree`` would
choose, from its measured head accuracies and this device's verification costs
(:func:`stage_tree`). Both are skipped when their output is there.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from draftheads.bench.stages import (
    answer_tokens,
    compose,
    done,
    drafter_settings,
    log,
    mark_done,
    target_group,
    train_overrides,
)
from draftheads.conf.commands.args import BenchArgs
from draftheads.conf.schema import BenchConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def stage_train(cfg: BenchArgs, b: BenchConfig, kind: str, rows: list[dict], steps: int, out: Path) -> Path:
    """A ``kind`` drafter trained on ``rows`` for ``steps`` steps into ``out``."""
    from draftheads.train.recipe import train

    tcfg = compose([f"target={target_group(cfg)}", *train_overrides(kind, out, steps)])
    made = {
        "kind": kind,
        "steps": steps,
        "answer_tokens": answer_tokens(rows),
        "draft": drafter_settings(tcfg),
    }
    if done(out, made):
        return out
    log(f"train {kind}: {len(rows)} rows, {made['answer_tokens']} answer tokens, {steps} steps")
    t0 = time.perf_counter()
    tcfg.target = cfg.target
    train(tcfg, rows=rows)
    mark_done(
        out,
        {"seconds": time.perf_counter() - t0, "answer_tokens": made["answer_tokens"], "steps": steps},
        made,
    )
    return out


def stage_tree(cfg: BenchArgs, target: PreTrainedModel, tok: PreTrainedTokenizerBase, heads: Path) -> None:
    """Choose the static tree of heads that index one by depth from measured head accuracies and this
    device's costs (tree.json)."""
    from draftheads.data.prompts import load_prompts
    from draftheads.decode.tree import TREE_FILE
    from draftheads.decode.tree_select import select_tree
    from draftheads.heads import Drafter

    if (heads / TREE_FILE).is_file():
        return
    log("tree: measuring head accuracies and the verification cost curve")
    dc = replace(cfg.decode, tree_size=0, tree_max_size=16)
    prompts = [r.turns[0] for r in load_prompts("heldout", max_prompts=dc.tree_prompts, tokenizer=tok)]
    drafter = Drafter.from_pretrained(heads, target=target, tokenizer=tok, map_location=target.device)
    t0 = time.perf_counter()
    record = select_tree(target, drafter, tok, prompts, dc, log=log)
    record["seconds"] = time.perf_counter() - t0
    (heads / TREE_FILE).write_text(json.dumps(record, indent=1) + "\n")
