"""Self-distillation: the target answers prompts (and optionally writes them), into JSONL shards.

:func:`distill` is the run: it checks the prompts, writes the manifest, answers what is missing
batch by batch and appends it to the shards, then counts the round trip. Its pieces live beside
it: the output folder and resuming in :mod:`draftheads.data.distill.shards`, the answering of a
batch's turns in :mod:`draftheads.data.distill.answers`, the generation itself in
:mod:`draftheads.data.distill.generate`, the round-trip count in
:mod:`draftheads.data.distill.roundtrip`.

**Context length.** A prompt whose tokens plus ``max_new_tokens`` exceed the target's positions
is skipped before any generation (counted in ``distill.json`` and printed); a later turn that
would exceed them ends its conversation early (counted in the row's ``finish`` as "context").

**Resume.** Prompts are sorted by length (stable) and cut into fixed batches; batch ``b`` is
sampled with seed ``seed + b``. Rows are appended per batch and flushed. A rerun repairs a
torn last line, skips every id already written and regenerates only what is missing, batch by
batch with the same composition and seed, so a killed-and-resumed run writes exactly what a
straight run writes. A rerun with other settings is refused.

**A serving engine.** With ``cfg.endpoint`` an OpenAI-compatible server answers instead,
row by row with ``cfg.concurrency`` requests in flight, into the same shards (each row's ``gen``
adds the endpoint, the served model and where ``answer_ids`` came from); the server is checked
against the target first, and a server that stops answering ends the run with the completed
shards kept (:mod:`draftheads.data.endpoint`).

**In-process**, the target's batched generation runs inside the ``runner`` the caller passes
(the commands pass ``data.distill.backend`` through :func:`draftheads.decode.backend.running`).
"""

from __future__ import annotations

import sys
from contextlib import closing, nullcontext
from dataclasses import asdict
from pathlib import Path

from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DistillConfig
from draftheads.data.distill.answers import answer_batch, fits, max_positions
from draftheads.data.distill.generate import (
    DecodeFn,
    GenerateFn,
    GenParams,
    Runner,
    decoder_generate,
    hf_generate,
    stock,
    stop_ids,
)
from draftheads.data.distill.roundtrip import write_roundtrip
from draftheads.data.distill.shards import append_rows, repair_shards, shard_path, shard_rows, write_manifest
from draftheads.data.endpoint import EndpointError, RowJob, Served, answered, connect, report_cut_short
from draftheads.data.outdir import claim_out_dir
from draftheads.data.prompts import PromptRow
from draftheads.heads.target.fingerprint import fingerprint


def sort_key(row: PromptRow) -> int:
    """Prompts batch by the length of their first turn (stable: equal lengths keep their order)."""
    return len(row.turns[0])


def distill(
    model: nn.Module,
    tokenizer,
    prompts: list[PromptRow],
    cfg: DistillConfig,
    generate: GenerateFn | None = None,
    source: str = "data",
    show_progress: bool = True,
    decode: DecodeFn | None = None,
    runner: Runner = stock,
) -> Path:
    """Answer every prompt with the target into ``cfg.out_dir`` (resuming), and return the directory.

    Generation goes through the server of ``cfg.endpoint`` when one is set (``generate``,
    ``decode`` and ``runner`` are then unused), else through ``generate``, else through ``decode``
    (see :func:`decoder_generate`), else through the target's own ``generate``; inside
    ``runner(model)`` (the caller's execution backend, e.g.
    ``partial(draftheads.decode.backend.running, "auto")``).
    """
    from tqdm.auto import tqdm

    if not prompts:
        raise UserError("no prompts to distill; check data.path")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise UserError("prompt ids are not unique; give rows an id field or remove duplicates")
    generate = generate or decoder_generate(model, tokenizer, decode)
    params = GenParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p)
    limit = max_positions(model)
    kept = [p for p in prompts if fits(tokenizer, p, limit, cfg.max_new_tokens)]
    if len(kept) < len(prompts):
        print(
            f"distill: skipped {len(prompts) - len(kept)} of {len(prompts)} prompts longer than the "
            f"target's {limit} positions minus data.distill.max_new_tokens={cfg.max_new_tokens}",
            file=sys.stderr,
        )
    if not kept:
        raise UserError(
            f"every prompt is longer than the target's {limit} positions minus "
            f"data.distill.max_new_tokens={cfg.max_new_tokens}; use shorter prompts or fewer new tokens"
        )
    fp = fingerprint(model, tokenizer)
    served = serving(model, tokenizer, cfg, fp.name) if cfg.endpoint else None
    gen_meta = {
        **asdict(params),
        "seed": cfg.seed,
        "target": fp.name,
        "tokenizer_hash": fp.tokenizer_hash[:16],
        **(served.meta() if served else {}),
    }
    out = Path(cfg.out_dir)
    claim_out_dir(cfg.out_dir, "distill", "data.distill.out_dir")  # refuses a foreign or busy folder
    write_manifest(
        out,
        {
            "fingerprint": fp.to_dict(),
            "generation": asdict(params),
            "seed": cfg.seed,
            "batch_size": cfg.batch_size,
            "shard_rows": cfg.shard_rows,
            "source": source,
            "num_prompts": len(prompts),
            # only when some were: a directory written before this count existed still resumes
            **({"skipped_too_long": len(prompts) - len(kept)} if len(kept) < len(prompts) else {}),
        },
    )
    done = repair_shards(out)
    ids = [p.id for p in kept]
    order = sorted(kept, key=sort_key)
    batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    todo = [(b, batch) for b, batch in enumerate(batches) if any(p.id not in done for p in batch)]
    if served is None:  # whole batches: a batch's composition and seed fix its sampled answers
        answers = (
            (b, *answer_batch(tokenizer, batch, generate, params, cfg.seed + b, limit)) for b, batch in todo
        )
        running = runner(model)
    else:  # row by row: each request is alone on the server, seeded by its row and turn
        job = RowJob(served, tokenizer, params, cfg.seed, limit, stop_ids(model, tokenizer))
        answers = answered(
            job, [(b, [p for p in batch if p.id not in done]) for b, batch in todo], cfg.concurrency
        )
        running = nullcontext()
    initial = len(done & set(ids))
    bar = tqdm(total=len(kept), initial=initial, unit="row", disable=not show_progress, desc="distill")
    new_tokens = 0
    try:
        with closing(answers), running:
            for b, rows, n in answers:
                new_tokens += n
                shard = shard_path(out, b, cfg.batch_size, cfg.shard_rows)
                bar.update(append_rows(shard, rows, done, gen_meta))
                done |= {r["id"] for r in rows}
                bar.set_postfix(new_tok_s=f"{new_tokens / max(bar.format_dict['elapsed'], 1e-9):.0f}")
    except EndpointError as e:
        raise UserError(
            f"{e}; the {len(done & set(ids))} of {len(kept)} rows already in {out} are kept: restart the "
            "server (or fix data.distill.endpoint) and rerun the same command to resume"
        ) from None
    finally:
        bar.close()
    if served is not None:
        report_cut_short(shard_rows(out))
    write_roundtrip(out, tokenizer)
    return out


def serving(model: nn.Module, tokenizer, cfg: DistillConfig, target: str) -> Served:
    """The server of ``cfg.endpoint``, checked against the in-process target's greedy answer."""
    local = hf_generate(model, tokenizer)

    def greedy(prompt: list[int], new_tokens: int) -> list[int]:
        return local([prompt], GenParams(new_tokens, 0.0, 1.0), 0)[0][0]

    return connect(cfg, tokenizer, greedy, target, stop_ids(model, tokenizer))
