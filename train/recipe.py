"""``draftheads train``: train a drafter on a frozen target, torchtune-style (setup -> train -> save).

Features:
    * every mode (Medusa-1, Medusa-2 + LoRA, EAGLE-1, EAGLE-3, DFlash) through one loop on the
      DeepSpeed engine: one CPU process, or many GPUs/nodes under torchrun;
    * only trainable parameters reach the optimizer; the target is never saved;
    * online target features every step, or offline from a feature cache read from disk as
      micro-batches need it (and its top-k logits as EAGLE-3's and DFlash's soft labels; a
      cache of more layers serves DFlash the ones it reads);
    * atomic, checksummed checkpoints every ``train.save_every`` steps and on Ctrl-C;
      ``train.resume=auto`` (the default) continues the exact loss trajectory (data order, RNG,
      optimizer and schedule are all restored), past a damaged newest checkpoint;
    * a NaN/inf loss stops the run, naming the last good checkpoint;
    * progress bar, ``metrics.jsonl``, wandb (offline without an API key), held-out top-k
      accuracy per head/step (DFlash: per block position) and a simulated acceptance length.

Run it as ``draftheads train draft=eagle3 target=tiny-llama train.max_steps=50`` (under
``torchrun --nproc_per_node=2 --no-python draftheads train ...`` for data parallelism). From
Python: :func:`run` (a typed :class:`Config`) or :func:`train` (with rows of your own).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.train import validate
from draftheads.heads import DFlashDrafter, Drafter, EagleDrafter, MedusaHeads
from draftheads.heads.dflash import choose_mask_token
from draftheads.heads.target import load_target, target_name
from draftheads.heads.target_fingerprint import fingerprint
from draftheads.train import checkpoint, dry_run
from draftheads.train.adapters import add_lora, save_adapters
from draftheads.train.batching import Layout, RowView, StepSampler, check_rows, micro_batch, split_heldout
from draftheads.train.card import model_card
from draftheads.train.engine import build_engine, init_distributed, zero_stage
from draftheads.train.guards import cast_shared_inputs, check_finished_run, check_output_dir, use_topk
from draftheads.train.metrics import MetricSink, Window
from draftheads.train.modules import (
    DFlashObjective,
    EagleObjective,
    Medusa2Objective,
    MedusaObjective,
    Objective,
)
from draftheads.train.objectives import chain_acceptance
from draftheads.train.vocab import draft_vocab, masked_token_counts, token_occurrences, vocab_coverage


def build_drafter(cfg: Config, target: nn.Module, tokenizer) -> Drafter:
    fp = fingerprint(target, tokenizer, name=target_name(cfg.target))
    d = cfg.draft
    if d.kind == "medusa":
        drafter = MedusaHeads(fp, num_heads=d.num_heads, num_layers=d.num_layers, lm_head=d.lm_head)
    elif d.kind == "dflash":
        drafter = DFlashDrafter(
            fp,
            target_config=target.config.to_dict(),
            mask_token_id=d.mask_token_id if d.mask_token_id is not None else choose_mask_token(tokenizer),
            block_size=d.block_size,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.training_layers(fp.num_layers),
            draft_vocab_size=d.draft_vocab_size,
        )
    else:
        drafter = EagleDrafter(
            fp,
            target_config=target.config.to_dict(),
            version=d.version,
            num_decoder_layers=d.num_decoder_layers,
            feature_layers=d.feature_layers,
            draft_vocab_size=d.draft_vocab_size if d.version == 3 else None,
            save_shared=d.save_shared,
            fc_bias=d.fc_bias,
        )
    return drafter.attach(target)


def check_mask_token(mask_id: int, rows: Any) -> None:
    """Refuse a DFlash mask token that occurs in the training rows: the drafter could not tell a
    masked block position from that token."""
    count, first = token_occurrences(rows, mask_id)
    if count:
        raise UserError(
            f"draft.mask_token_id={mask_id} occurs {count} time(s) in the training rows (first in row {first}); "
            "set draft.mask_token_id to a token id that never occurs in the data (e.g. an unused special token)"
        )


def check_anchor_count(anchors: int, rows: Any) -> None:
    """Refuse ``draft.anchors_per_row`` above every row's answer tokens: no row could hold that
    many blocks, so the count is a mistake (0 asks for a block at every answer position)."""
    most = max((int(sum(r["loss_mask"])) for r in rows), default=0)
    if anchors > most:
        raise UserError(
            f"draft.anchors_per_row={anchors} is above the most answer tokens of any training row ({most}); "
            f"use at most {most}, or 0 for a block at every answer position"
        )


def dflash_topk(cache, t) -> bool:
    """Whether DFlash learns from the cache's top-k logits (``train.soft_labels`` auto or topk;
    ``full`` is refused when the config is read), refusing ``topk`` from a cache without them."""
    stored = int(cache.manifest.get("topk", 0))
    if t.soft_labels == "topk" and not stored:
        raise UserError(
            f"train.soft_labels=topk but feature cache {cache.dir} stores no top-k logits; rebuild "
            "it with data.features.topk=64, or use train.soft_labels=auto (the data's next tokens)"
        )
    return bool(stored)


def gathered(params: list[nn.Parameter], stage: int):
    """Under ZeRO-3, make partitioned parameters whole for the duration of the block."""
    if stage == 3 and any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=0)
    return contextlib.nullcontext()


def config_dict(cfg: Config) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


class TrainRecipe:
    """One training run: :meth:`setup`, :meth:`train`, :meth:`save`.

    ``hooks`` are called as ``hook(recipe)`` after every optimizer step (progress reporting,
    tests that interrupt a run at a given step).
    """

    def __init__(self, cfg: Config, rows: Any = None, hooks: list[Callable] | None = None) -> None:
        validate(cfg)
        self.cfg = cfg
        self.given_rows = rows
        self.hooks = list(hooks or [])
        self.out = Path(cfg.train.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        check_finished_run(self.out, config_dict(cfg))
        check_output_dir(self.out)

    # ---- setup -----------------------------------------------------------------------
    def setup(self) -> TrainRecipe:
        cfg, t = self.cfg, self.cfg.train
        self.rank, self.world = init_distributed()
        self.stage = zero_stage(cfg.deepspeed)
        resume_from = self.resume_point()
        torch.manual_seed(t.seed)  # identical drafter initialisation on every rank
        self.target, self.tokenizer = load_target(cfg.target)
        cast_shared_inputs(self.target)
        self.drafter = build_drafter(cfg, self.target, self.tokenizer)
        self.module = self.build_objective()
        rows, tokens = self.load_rows()
        if isinstance(self.drafter, DFlashDrafter):
            check_mask_token(self.drafter.mask_token_id, tokens)
            check_anchor_count(cfg.draft.anchors_per_row, tokens)
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
        self.init_drafter_weights()
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
            resume_from, self.step = checkpoint.load_readable(
                self.engine, resume_from, self.rank, auto, self.check_resumable
            )
        self.sink = MetricSink(self.out, cfg.logger, config_dict(cfg), self.rank)
        self.sink.truncate_after(self.step)  # rows of steps this run will log again
        self.last_good = resume_from
        self.saved_step = self.step
        self.final_metrics: dict[str, float] = {}
        return self

    def resume_point(self) -> Path | None:
        resume = self.cfg.train.resume
        if resume != "none":
            ckpt = checkpoint.intact_checkpoint(self.ckpt_root) if resume == "auto" else Path(resume)
            why = checkpoint.damage(ckpt) if ckpt is not None and resume != "auto" else None
            if why is not None:
                raise UserError(f"train.resume={ckpt} is damaged ({why}); pick another checkpoint")
            if ckpt is not None:
                self.check_resumable(ckpt)
            return ckpt
        latest = checkpoint.latest_checkpoint(self.ckpt_root)
        if latest is not None:
            raise UserError(
                f"train.out_dir={self.out} already holds checkpoints (latest {latest.name}); "
                "pass train.resume=auto to continue it, or pick another train.out_dir"
            )
        return None

    def check_resumable(self, ckpt: Path) -> None:
        """Refuse a checkpoint written by a differently configured run: its steps would not continue
        this one (another drafter shape, data, order or optimizer)."""
        saved = checkpoint.saved_config(ckpt)
        if saved is None:
            raise UserError(
                f"{ckpt} has no readable drafter/config.json, so its run config is unknown; "
                "pick another checkpoint or pass train.resume=none with a new train.out_dir"
            )
        diff = checkpoint.config_mismatch(saved, config_dict(self.cfg))
        if diff is not None:
            raise UserError(
                f"cannot resume from {ckpt}: {diff}; rerun with the checkpoint's value, "
                "or start fresh in another train.out_dir"
            )

    def build_objective(self) -> Objective:
        d, topk = self.cfg.draft, self.cfg.train.topk
        if d.kind == "eagle":
            return EagleObjective(self.drafter, self.target, d, topk)
        if d.kind == "dflash":
            return DFlashObjective(self.drafter, self.target, d, topk)
        if d.lora:
            self.drafter.requires_adapters = True
            return Medusa2Objective(self.drafter, add_lora(self.target, d), d, topk)
        return MedusaObjective(self.drafter, self.target, d, topk)

    def load_rows(self) -> tuple[Any, Any]:
        """(training rows, their token columns only). A feature cache stays memory-mapped on disk:
        a row's features are read when its micro-batch is built."""
        t = self.cfg.train
        if t.features == "offline":
            from draftheads.data.cache import FeatureCache

            dflash = self.cfg.draft.kind == "dflash"
            fp, layers = self.drafter.target_fingerprint, self.module.layers()
            # a cache of more layers (one built for several drafters) serves the ones read here
            cache = FeatureCache(t.feature_cache, fp, layers, subset=True)
            soft = dflash_topk(cache, t) if dflash else use_topk(cache, t, self.cfg.draft)
            names = ["input_ids", "loss_mask", "features"]
            names += ["topk_ids", "topk_logits"] if soft else []
            tokens = cache.view(["input_ids", "loss_mask"])
            check_rows(tokens)
            return cache.view(names), tokens
        if self.given_rows is not None:
            source = self.given_rows
        elif t.rows:
            import datasets

            source = datasets.load_from_disk(t.rows)
        else:
            from draftheads.data.prepare import prepare_dataset
            from draftheads.data.regenerated import check_regenerated_by

            check_regenerated_by(self.cfg.data, self.drafter.target_fingerprint)
            source, _ = prepare_dataset(self.cfg.data, self.tokenizer, split="train")
        keep = ("input_ids", "loss_mask", "position_ids", "features")
        rows = [{k: r[k] for k in keep if k in r} for r in source]
        check_rows(rows)
        return rows, rows

    @torch.no_grad()
    def init_drafter_weights(self) -> None:
        """Weights that come from the target or the data, before the engine partitions anything."""
        d = self.drafter
        lm_head = d.shared("lm_head")
        with gathered([lm_head.weight], self.stage):  # the full weight, even if the target is partitioned
            if isinstance(d, MedusaHeads):
                d.init_lm_heads_from_target()
            elif isinstance(d, DFlashDrafter) and d.reduced_vocab:  # its head: the target's rows of these ids
                self.set_draft_vocab(d)
            elif isinstance(d, EagleDrafter) and d.version == 3:
                self.set_draft_vocab(d)
                d.init_lm_head_from_target()
        if self.cfg.draft.kind in ("eagle", "dflash") and self.cfg.draft.init_from_target:
            with gathered(list(self.target.parameters()), self.stage):
                d.init_from_target(self.target)
        if isinstance(d, DFlashDrafter) and self.cfg.draft.qk_gain != 1.0:
            d.set_qk_gain(self.cfg.draft.qk_gain)

    def set_draft_vocab(self, d: Drafter) -> None:
        """The ``draft_vocab_size`` most frequent answer tokens of the training rows as the draft vocabulary."""
        counts = masked_token_counts(self.train_tokens, d.target_fingerprint.vocab_size)
        ids = draft_vocab(counts, d.draft_vocab_size)
        d.set_vocab(ids)
        self.data_info["draft_vocab_coverage"] = round(vocab_coverage(counts, ids), 4)

    # ---- train -----------------------------------------------------------------------
    def batch(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = micro_batch(rows, self.tokenizer.pad_token_id or 0, self.cfg.train.pack_micro_batches)
        return {k: v.to(self.engine.device) for k, v in batch.items()}

    def train(self) -> TrainRecipe:
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

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out top-1 per head/step (DFlash: per block position k = 1 .. block-1) against the
        target's greedy tokens, and tau: a top-1 chain's accepted length (DFlash: a block's)."""
        self.engine.eval()
        d = self.cfg.draft
        depth = {"medusa": d.num_heads, "eagle": d.ttt_steps, "dflash": d.block_size - 1}[d.kind]
        depth = max(depth, 1)
        hits, counts, gains = None, None, []
        mbs = self.cfg.train.micro_batch_size
        for i in range(0, len(self.held_rows), mbs):
            correct, valid = self.module.chains(self.batch(self.held_rows[i : i + mbs]), depth)
            h, c = (correct & valid).flatten(1).sum(1), valid.flatten(1).sum(1)
            hits, counts = (h, c) if hits is None else (hits + h, counts + c)
            gains.append(chain_acceptance(correct, valid)[valid[0]].double())
        self.engine.train()
        name, first = {"medusa": ("head", 0), "eagle": ("step", 0), "dflash": ("pos", 1)}[d.kind]
        out = {
            f"eval/{name}{s + first}/acc_top1": float(hits[s]) / max(int(counts[s]), 1)
            for s in range(len(hits))
        }
        gain = torch.cat(gains)
        out["eval/tau"] = float(gain.mean()) if gain.numel() else 1.0
        return out

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
        """The loadable drafter (and Medusa-2's adapters) into ``directory``; rank 0 writes."""
        params = list(self.module.parameters())
        with gathered(params, self.stage):
            if self.rank == 0:
                self.drafter.provenance = self.provenance()
                self.drafter.save_pretrained(directory)
                if self.drafter.requires_adapters:
                    save_adapters(self.module.adapted, directory)

    def save(self) -> Path:
        """The drafter, the resolved config and the model card into ``train.output_dir``."""
        from omegaconf import OmegaConf

        self.export_drafter(self.out)
        if self.rank == 0:
            (self.out / "resolved_config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(self.cfg)))
            prov = self.provenance()
            prov["tokens_seen"] = int(sum(r.get("tokens", 0) for r in _metrics(self.out)))
            (self.out / "README.md").write_text(model_card(self.drafter, prov, self.final_metrics))
        self.sink.close()
        if dist.is_initialized():
            dist.barrier()
        return self.out


def _metrics(out: Path) -> list[dict]:
    from draftheads.train.metrics import read_metrics

    return read_metrics(out) if (out / "metrics.jsonl").is_file() else []


def train(cfg: Config, rows: Any = None, hooks: list[Callable] | None = None) -> Path:
    """Run a whole training job and return its output directory.

    ``rows`` (optional) replaces the data pipeline: any iterable of dicts with ``input_ids`` and
    ``loss_mask`` (a ``datasets.Dataset`` works). On Ctrl-C the completed steps are saved as a
    checkpoint, so the same call with ``train.resume=auto`` continues the run exactly.
    """
    recipe = TrainRecipe(cfg, rows, hooks).setup()
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
    ``train.dry_run``, the recipe's dry run instead (:mod:`draftheads.train.dry_run`)."""
    if cfg.train.dry_run:
        return dry_run.run(cfg, train)
    out = train(cfg)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"drafter saved to {out}")
    return out


def main(cfg: Config) -> None:
    """The ``draftheads train`` command (kept for the CLI's table; see :func:`run`)."""
    run(cfg)
