"""``draftheads train``: train a drafter on a frozen target, torchtune-style (setup -> train -> save).

Features:
    * every drafter kind, each through its own objective (``train/modules/<kind>.py``; one may
      train LoRA adapters on the target too), in one loop on the DeepSpeed engine: one CPU
      process, or many GPUs/nodes under torchrun;
    * only trainable parameters reach the optimizer; the target is never saved;
    * online target features every step, or offline from a feature cache read from disk as
      micro-batches need it (and its top-k logits as soft labels, for a drafter that learns from
      them; a cache of more layers serves a drafter the ones it reads);
    * atomic, checksummed checkpoints every ``train.save_every`` steps and on Ctrl-C;
      ``train.resume=auto`` (the default) continues the exact loss trajectory (data order, RNG,
      optimizer and schedule are all restored), past a damaged newest checkpoint;
    * a NaN/inf loss stops the run, naming the last good checkpoint;
    * progress bar, ``metrics.jsonl``, wandb (offline without an API key), held-out top-k
      accuracy per draft step (a step, a head or a block position) and a simulated acceptance
      length.

Run it as ``draftheads train draft=<group> target=tiny-llama train.max_steps=50`` (under
``torchrun --nproc_per_node=2 --no-python draftheads train ...`` for data parallelism). From
Python: :func:`run` (a typed :class:`Config`) or :func:`train` (with rows of your own).

This file is the run's order; what each stage calls lives in files named for it: the drafter,
its first weights and its objective (:mod:`~draftheads.train.drafters`), the rows and their
checks (:mod:`~draftheads.train.rows`), the checkpoint to continue from
(:mod:`~draftheads.train.resume`), the held-out metrics (:mod:`~draftheads.train.evaluation`)
and what is written of the drafter (:mod:`~draftheads.train.saving`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.train import validate
from draftheads.heads.masks import recurrent_kinds
from draftheads.heads.target.load import load_target
from draftheads.train import checkpoint, saving
from draftheads.train.batching import Layout, RowView, StepSampler, micro_batch, split_heldout
from draftheads.train.drafters import build_drafter, build_objective, init_drafter_weights
from draftheads.train.dry_run import main as dry_run
from draftheads.train.engine import build_engine, init_distributed, zero_stage
from draftheads.train.evaluation import heldout_metrics
from draftheads.train.guards import cast_shared_inputs, check_finished_run, check_output_dir
from draftheads.train.metrics import MetricSink, Window
from draftheads.train.resume import check_resumable, resume_point
from draftheads.train.rows import (
    cached_rows,
    pipeline_rows,
    saved_rows,
    token_rows,
)
from draftheads.train.saving import config_dict


class TrainRecipe:
    """One training run: :meth:`setup`, :meth:`train`, :meth:`save`.

    ``hooks`` are called as ``hook(recipe)`` after every optimizer step (progress reporting,
    tests that interrupt a run at a given step). ``target`` is ``(model, tokenizer)`` as
    :func:`~draftheads.heads.target.load.load_target` loaded ``cfg.target`` in this process, to
    train on instead of loading it again (an objective that puts LoRA adapters on the target adds
    them to that model in place).
    """

    def __init__(
        self, cfg: Config, rows: Any = None, hooks: list[Callable] | None = None, target: tuple | None = None
    ) -> None:
        validate(cfg)
        self.cfg = cfg
        self.given_rows = rows
        self.given_target = target
        self.hooks = list(hooks or [])
        self.out = Path(cfg.train.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        check_finished_run(self.out, config_dict(cfg))
        check_output_dir(self.out)

    # ---- setup -----------------------------------------------------------------------
    def setup(self) -> TrainRecipe:
        """Everything before the first step: process group, resume point, target, drafter and
        objective, rows and their checks, first weights, engine, sampler and metric sink."""
        cfg, t = self.cfg, self.cfg.train
        self.rank, self.world = init_distributed()
        self.stage = zero_stage(cfg.deepspeed)
        resume_from = resume_point(t.resume, self.ckpt_root, self.out, config_dict(cfg))
        torch.manual_seed(t.seed)  # identical drafter initialisation on every rank
        self.target, self.tokenizer = self.given_target or load_target(cfg.target)
        cast_shared_inputs(self.target)
        self.drafter = build_drafter(cfg, self.target, self.tokenizer)
        self.module = build_objective(self.drafter, self.target, cfg.draft, t.topk)
        rows, tokens = self.load_rows()
        type(self.module).check_rows(self.drafter, cfg.draft, tokens)
        if self.rank == 0:  # the data is accepted: from here on the run changes its folder
            checkpoint.remove_partials(self.ckpt_root)
        train_idx, held_idx = split_heldout(len(rows), t.eval_rows, t.seed)
        self.train_rows, self.held_rows = RowView(rows, train_idx), RowView(rows, held_idx)
        self.train_tokens = RowView(tokens, train_idx)  # token columns only: no features read
        self.data_info = {
            "source": t.rows or t.feature_cache or cfg.data.path,
            "rows": len(self.train_rows),
            "heldout_rows": len(self.held_rows),
            "loss_tokens": int(sum(int(sum(r["loss_mask"])) for r in self.train_tokens)),
        }
        self.data_info.update(
            init_drafter_weights(self.drafter, self.target, cfg.draft, self.train_tokens, self.stage)
        )
        layout = Layout(t.micro_batch_size, t.grad_accum, self.world, self.rank)
        self.sampler = StepSampler(len(self.train_rows), t.seed, layout)
        self.total_steps = (
            max(1, math.ceil(t.epochs * len(self.train_rows) / layout.samples_per_step))
            if t.epochs
            else t.max_steps
        )
        self.engine = build_engine(self.module, cfg.deepspeed, t, self.total_steps)
        self.step = 0
        if resume_from is not None:
            auto = t.resume == "auto"
            check = partial(check_resumable, current=config_dict(cfg))
            resume_from, self.step = checkpoint.load_readable(
                self.engine, resume_from, self.rank, auto, check
            )
        self.sink = MetricSink(self.out, cfg.logger, config_dict(cfg), self.rank)
        self.sink.truncate_after(self.step)  # rows of steps this run will log again
        self.last_good = resume_from
        self.saved_step = self.step
        self.final_metrics: dict[str, float] = {}
        return self

    def load_rows(self) -> tuple[Any, Any]:
        """(training rows, their token columns only). A feature cache stays memory-mapped on disk:
        a row's features are read when its micro-batch is built."""
        t = self.cfg.train
        if t.features == "offline":
            return cached_rows(
                self.cfg, self.drafter.target_fingerprint, self.module.layers(), type(self.module).reads_topk
            )
        if self.given_rows is not None:
            return token_rows(self.given_rows)
        if t.rows:
            return token_rows(saved_rows(t.rows))
        return token_rows(pipeline_rows(self.cfg, self.drafter.target_fingerprint, self.tokenizer))

    # ---- train -----------------------------------------------------------------------
    def batch(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        """``rows`` as one micro-batch (packed or padded) on the engine's device."""
        # a recurrent layer's state would run on across packed documents: its rows are padded instead
        pack = self.cfg.train.pack_micro_batches and not recurrent_kinds(self.target.config)
        batch = micro_batch(rows, self.tokenizer.pad_token_id or 0, pack)
        return {k: v.to(self.engine.device) for k, v in batch.items()}

    def train(self) -> TrainRecipe:
        """Optimizer steps up to ``train.stop_at`` (or the end), logging, evaluating, checkpointing
        and calling the hooks as configured."""
        t = self.cfg.train
        end = min(self.total_steps, t.stop_at or self.total_steps)
        from tqdm.auto import tqdm

        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            disable=self.rank != 0 or not t.progress,
            unit="step",
            dynamic_ncols=True,
        )
        window, losses, tokens, started = Window(), [], 0.0, time.perf_counter()
        grad_norm = float("nan")
        self.engine.train()
        while self.step < end:
            self.step_rng = checkpoint.rng_state()  # what an interrupted step's rerun must redraw
            step_loss = torch.zeros(2, dtype=torch.float64)
            for micro in range(t.grad_accum):
                batch = self.batch([self.train_rows[i] for i in self.sampler.indices(self.step, micro)])
                loss, stats = self.engine(batch, self.step)
                self.engine.backward(loss)
                if self.engine.is_gradient_accumulation_boundary():
                    grad_norm = self.grad_norm()
                self.engine.step()
                window.add(stats)
                step_loss += torch.tensor([loss.item() / t.grad_accum, float(batch["attention_mask"].sum())])
            if self.world > 1:
                dist.all_reduce(step_loss)
                step_loss[0] /= self.world
            value = float(step_loss[0])
            self.check_finite(value)
            self.step += 1
            self.step_rng = None  # the step is complete: an interrupt from here on saves the RNG as is
            losses.append(value)
            tokens += float(step_loss[1])
            elapsed = time.perf_counter() - started
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}", tok_s=f"{tokens / max(elapsed, 1e-9):.0f}")
            if self.step % t.log_every == 0 or self.step == end:
                engine_gn = self.engine.get_global_grad_norm()
                metrics = {
                    "loss": sum(losses) / len(losses),
                    **{f"train/{k}": v for k, v in window.reduce().items()},
                    "grad_norm": float(engine_gn) if engine_gn is not None else grad_norm,
                    "tokens_per_s": tokens / max(elapsed, 1e-9),
                    "tokens": tokens,
                    **self.learning_rates(),
                }
                self.sink.log(self.step, metrics)
                losses, tokens, started = [], 0.0, time.perf_counter()
            if t.eval_every and (self.step % t.eval_every == 0 or self.step == end):
                self.final_metrics = self.evaluate()
                self.sink.log(self.step, self.final_metrics)
            if (t.save_every and self.step % t.save_every == 0) or (self.step == end < self.total_steps):
                self.save_checkpoint()
            for hook in self.hooks:
                hook(self)
        bar.close()
        return self

    def grad_norm(self) -> float:
        """L2 norm of the (reduced, unclipped) gradients, where DeepSpeed leaves them whole."""
        if self.stage > 0:
            return float("nan")  # DeepSpeed reports it after the step (get_global_grad_norm)
        norms = [p.grad.detach().float().norm() for p in self.module.parameters() if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def learning_rates(self) -> dict[str, float]:
        groups = self.engine.optimizer.param_groups
        return {f"lr/{g.get('name', i)}": float(g["lr"]) for i, g in enumerate(groups)}

    def check_finite(self, value: float) -> None:
        if math.isfinite(value):
            return
        where = (
            f"the last good checkpoint is {self.last_good} (resume with train.resume=auto)"
            if self.last_good
            else "no checkpoint was written yet"
        )
        raise UserError(
            f"loss is {value} at step {self.step + 1}; stopped. {where}; lower train.lr or check the data"
        )

    def evaluate(self) -> dict[str, float]:
        """The held-out metrics (:func:`heldout_metrics`), the engine in eval mode meanwhile."""
        self.engine.eval()
        metrics = heldout_metrics(
            self.module, self.held_rows, self.batch, self.cfg.draft, self.cfg.train.micro_batch_size
        )
        self.engine.train()
        return metrics

    def save_checkpoint(self, rng: dict | None = None) -> None:
        path = checkpoint.save(self.engine, self.ckpt_root, self.step, self.rank, self.export_drafter, rng)
        if self.rank == 0:
            checkpoint.prune(self.ckpt_root, self.cfg.train.keep_checkpoints)
        self.last_good = path
        self.saved_step = self.step

    def save_interrupted(self) -> None:
        """On Ctrl-C: checkpoint the completed steps (the step in flight is redone on resume).

        Not when the interrupt fell between the optimizer update of a step and its bookkeeping:
        the weights would then be a step ahead of the saved counters.
        """
        if self.step <= self.saved_step or getattr(self.engine, "global_steps", self.step) != self.step:
            return
        self.save_checkpoint(rng=getattr(self, "step_rng", None))  # None: the RNG as it is now
        if self.rank == 0:
            print(
                f"interrupted: steps 1-{self.step} saved in {self.last_good}; "
                "rerun the same command (train.resume=auto) to continue",
                file=sys.stderr,
            )

    # ---- save ------------------------------------------------------------------------
    def provenance(self) -> dict[str, Any]:
        return {
            "config": config_dict(self.cfg),
            "data": self.data_info,
            "steps": self.step,
            "total_steps": self.total_steps,
            "world_size": self.world,
            "eval": self.final_metrics,
        }

    def export_drafter(self, directory: Path) -> None:
        """The loadable drafter (and the target's LoRA adapters, when it trained them) into
        ``directory``; rank 0 writes."""
        saving.export_drafter(self.drafter, self.module, directory, self.provenance(), self.rank, self.stage)

    def save(self) -> Path:
        """The drafter, the resolved config and the model card into ``train.output_dir``."""
        self.export_drafter(self.out)
        if self.rank == 0:
            saving.write_run_files(self.out, self.cfg, self.drafter, self.provenance(), self.final_metrics)
        self.sink.close()
        if dist.is_initialized():
            dist.barrier()
        return self.out


def train(
    cfg: Config, rows: Any = None, hooks: list[Callable] | None = None, target: tuple | None = None
) -> Path:
    """Run a whole training job and return its output directory.

    ``rows`` (optional) replaces the data pipeline: any iterable of dicts with ``input_ids`` and
    ``loss_mask`` (a ``datasets.Dataset`` works). ``target`` (optional) is the target of
    ``cfg.target`` already loaded in this process, as ``(model, tokenizer)``. On Ctrl-C the completed steps are saved as a
    checkpoint, so the same call with ``train.resume=auto`` continues the run exactly.
    """
    recipe = TrainRecipe(cfg, rows, hooks, target).setup()
    try:
        recipe.train()
    except KeyboardInterrupt:
        recipe.save_interrupted()
        recipe.sink.close()
        raise
    except BaseException:
        recipe.sink.close()
        raise
    return recipe.save()


def run(cfg: Config) -> Path | None:
    """The whole ``draftheads train`` job (setup -> train -> save) from a typed config; with
    ``train.dry_run``, the recipe's dry run instead (:mod:`draftheads.train.dry_run.main`)."""
    if cfg.train.dry_run:
        return dry_run.run(cfg, train)
    out = train(cfg)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"drafter saved to {out}")
    return out


def main(cfg: Config) -> None:
    """The ``draftheads train`` command (kept for the CLI's table; see :func:`run`)."""
    run(cfg)
