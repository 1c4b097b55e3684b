"""Self-distillation: the target answers prompts (and optionally writes them), into JSONL shards.

Output directory::

    distill.json           target fingerprint, generation parameters, prompt source, batch size
    prompts.jsonl          (self-prompt source only) the target-written, deduplicated prompts
    prompts.stats.json     their diversity: distinct n-grams, length spread, duplicates removed
    shard-00000.jsonl      one chat per line, OpenAI-messages format (``draftheads data`` reads it)

Each output row is ``{"id", "category", "messages", "gen", "finish", "answer_ids"}``; ``answer_ids``
holds the token ids the target generated for each assistant turn (before any decode), and
``roundtrip.json`` counts the rows whose answers tokenize differently once decoded
(:func:`roundtrip_changes`). ``gen`` repeats the
generation parameters and the target's name and tokenizer hash, so a row is self-describing.
An answer cut off by ``max_new_tokens`` (``finish`` "length") carries ``"unfinished": true`` in
its message (``false`` otherwise): training then does not teach an end-of-turn the target never produced there.

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

**Pluggable generation.** In-process, everything goes through a :data:`GenerateFn` (token ids in, new
token ids out). :func:`hf_generate` wraps the target's own ``model.generate``;
:func:`decoder_generate` wraps any decoder with that calling convention (:data:`DecodeFn`, e.g.
a speculative decoder's ``generate``), which the caller builds and passes in. The target's
batched generation runs inside the ``runner`` the caller passes (the commands pass
``data.distill.backend`` through :func:`draftheads.decode.backend.running`).
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, closing, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DistillConfig
from draftheads.data.chat import generation_prompt
from draftheads.data.endpoint import EndpointError, RowJob, Served, answered, connect, report_cut_short
from draftheads.data.outdir import claim_out_dir
from draftheads.data.prompts import PromptRow
from draftheads.heads.target_fingerprint import fingerprint

MANIFEST = "distill.json"
PROMPTS = "prompts.jsonl"
ROUNDTRIP = "roundtrip.json"


@dataclass(frozen=True)
class GenParams:
    max_new_tokens: int
    temperature: float
    top_p: float

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


# (prompt token ids per row, params, seed) -> (new token ids per row, stopped at end-of-turn per row)
GenerateFn = Callable[[list[list[int]], GenParams, int], tuple[list[list[int]], list[bool]]]
# ``decode(input_ids, attention_mask=, max_new_tokens=, do_sample=, temperature=, top_p=,
# eos_token_id=) -> ids [B, T + new]``: transformers' ``generate`` calling convention.
DecodeFn = Callable[..., torch.Tensor]
# how the target runs while generating: model -> a context manager (an execution backend)
Runner = Callable[..., AbstractContextManager]


def stop_ids(model, tokenizer) -> list[int]:
    """The target's end-of-sequence ids: the tokenizer's and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen if isinstance(gen, list) else [gen])
    return sorted(i for i in ids if i is not None)


def batched(model, tokenizer, run: Callable) -> GenerateFn:
    """A :data:`GenerateFn` around ``run(ids, attention_mask, params, stops, pad) -> ids``.

    Prompts are left-padded into one batch; each output row ends before its first stop token.
    The seed makes sampling reproducible batch by batch (what resuming relies on).
    """
    stops = stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    device = model.get_input_embeddings().weight.device  # a sharded target's: where its embedding is

    @torch.no_grad()
    def generate(prompts: list[list[int]], p: GenParams, seed: int) -> tuple[list[list[int]], list[bool]]:
        width = max(len(x) for x in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, x in enumerate(prompts):
            ids[i, width - len(x) :] = torch.tensor(x)
            attn[i, width - len(x) :] = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = run(ids.to(device), attn.to(device), p, stops, pad)
        rows, stopped = [], []
        for seq in out[:, width:].tolist():
            cut = next((j for j, t in enumerate(seq) if t in stops), None)
            rows.append(seq if cut is None else seq[:cut])
            stopped.append(cut is not None)
        return rows, stopped

    return generate


def hf_generate(model, tokenizer) -> GenerateFn:
    """Batched ``model.generate``."""

    def run(ids, attn, p: GenParams, stops, pad):
        sampling = {} if p.greedy else {"temperature": p.temperature, "top_p": p.top_p, "top_k": 0}
        return model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=p.max_new_tokens,
            do_sample=not p.greedy,
            pad_token_id=pad,
            eos_token_id=stops,
            **sampling,
        )

    return batched(model, tokenizer, run)


def decoder_generate(model, tokenizer, decode: DecodeFn | None = None) -> GenerateFn:
    """Batched generation through ``decode`` (for example a speculative decoder's ``generate``,
    which gives :func:`hf_generate`'s output token for token under greedy decoding, faster);
    without one, the target's own ``generate``."""
    if decode is None:
        return hf_generate(model, tokenizer)

    def run(ids, attn, p: GenParams, stops, pad):
        return decode(
            ids,
            attention_mask=attn,
            max_new_tokens=p.max_new_tokens,
            do_sample=not p.greedy,
            temperature=p.temperature if not p.greedy else 1.0,
            top_p=p.top_p,
            top_k=0,  # as hf_generate: no top-k cut, whatever the model's generation config says
            eos_token_id=stops,
        )

    return batched(model, tokenizer, run)


def stock(model) -> AbstractContextManager:
    """Run the target as it is (no execution backend): the default ``runner``."""
    return nullcontext()


def sort_key(row: PromptRow) -> int:
    return len(row.turns[0])


def max_positions(model) -> int | None:
    """The target's number of positions (``max_position_embeddings``; GPT-2's ``n_positions``)."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fits(tokenizer, prompt: PromptRow, limit: int | None, max_new_tokens: int) -> bool:
    """Whether the first turn's prompt plus ``max_new_tokens`` fits the target's positions."""
    if limit is None:
        return True
    text = generation_prompt(tokenizer, [{"role": "user", "content": prompt.turns[0]}])
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + max_new_tokens <= limit


def repair_shards(out: Path) -> set[str]:
    """Drop a torn last line from each shard; return the ids already written."""
    done: set[str] = set()
    for shard in sorted(out.glob("shard-*.jsonl")):
        data = shard.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            shard.write_bytes(data)
        for n, line in enumerate(data.splitlines()):
            try:
                done.add(json.loads(line)["id"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError(
                    f"{shard}:{n + 1} is corrupt; delete that line (or the shard) and rerun to regenerate it"
                ) from None
    return done


def write_manifest(out: Path, manifest: dict) -> None:
    """Write ``distill.json``, or refuse when ``out`` holds a run with other settings."""
    path = out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        if old != manifest:
            diff = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
            raise UserError(
                f"{out} holds a distillation with other settings ({', '.join(diff)}); "
                "use another data.distill.out_dir or the same settings to resume"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1))


def distill(
    model,
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
                shard = out / f"shard-{b * cfg.batch_size // cfg.shard_rows:05d}.jsonl"
                with open(shard, "a", encoding="utf-8") as f:
                    for row in rows:
                        if row["id"] not in done:
                            f.write(json.dumps({**row, "gen": gen_meta}, ensure_ascii=False) + "\n")
                            bar.update(1)
                    f.flush()
                    os.fsync(f.fileno())
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


def serving(model, tokenizer, cfg: DistillConfig, target: str) -> Served:
    """The server of ``cfg.endpoint``, checked against the in-process target's greedy answer."""
    local = hf_generate(model, tokenizer)

    def greedy(prompt: list[int], new_tokens: int) -> list[int]:
        return local([prompt], GenParams(new_tokens, 0.0, 1.0), 0)[0][0]

    return connect(cfg, tokenizer, greedy, target, stop_ids(model, tokenizer))


def answer_batch(
    tokenizer,
    batch: list[PromptRow],
    generate: GenerateFn,
    params: GenParams,
    seed: int,
    limit: int | None = None,
) -> tuple[list[dict], int]:
    """Answer each row's user turns in order (turn t sees the answers to turns < t).

    A later turn whose prompt plus ``max_new_tokens`` would pass ``limit`` positions ends that
    conversation (``finish`` gets "context"); a cut-off answer is marked ``unfinished``.
    """
    chats: list[list[dict]] = [[] for _ in batch]
    finish: list[list[str]] = [[] for _ in batch]
    answer_ids: list[list[list[int]]] = [[] for _ in batch]
    ended: set[int] = set()
    n_new = 0
    for t in range(max(len(p.turns) for p in batch)):
        live, enc = [], []
        for i, p in enumerate(batch):
            if t >= len(p.turns) or i in ended:
                continue
            turn = [*chats[i], {"role": "user", "content": p.turns[t]}]
            ids = tokenizer(generation_prompt(tokenizer, turn), add_special_tokens=False)["input_ids"]
            if limit is not None and len(ids) + params.max_new_tokens > limit:
                ended.add(i)
                finish[i].append("context")
                continue
            chats[i] = turn
            live.append(i)
            enc.append(ids)
        if not live:
            continue
        answers, stopped = generate(enc, params, seed * 1000 + t)
        for i, ans, ok in zip(live, answers, stopped):
            n_new += len(ans)
            text = tokenizer.decode(ans, skip_special_tokens=True)
            # every answer carries the flag, so JSON readers infer one schema for all rows
            chats[i].append({"role": "assistant", "content": text, "unfinished": not ok})
            finish[i].append("stop" if ok else "length")
            answer_ids[i].append(ans)
    rows = [
        {
            "id": p.id,
            "category": p.category,
            "messages": chats[i],
            "finish": finish[i],
            "answer_ids": answer_ids[i],
        }
        for i, p in enumerate(batch)
    ]
    return rows, n_new


def shard_rows(out: Path) -> list[dict]:
    """Every row of a distillation's shards, in shard order."""
    return [
        json.loads(line) for f in sorted(Path(out).glob("shard-*.jsonl")) for line in f.open(encoding="utf-8")
    ]


def changed_tokens(ids: list[int], again: list[int]) -> int:
    """Generated tokens not kept by the re-tokenization (outside the longest matching blocks)."""
    blocks = difflib.SequenceMatcher(a=ids, b=again, autojunk=False).get_matching_blocks()
    return len(ids) - sum(b.size for b in blocks)


def roundtrip_changes(out: Path, tokenizer) -> dict:
    """How much distilled text changes when decoded and tokenized again: rows, answers and
    tokens whose generated ids (``answer_ids``) differ from ``encode(decode(ids))``, over every
    shard row. (On SmolLM2 about 0.4% of tokens: the target sometimes emits a non-canonical
    split such as ``Ġsm`` + ``ok`` for ``Ġsmok``.)"""
    rows = shard_rows(out)
    answers = [r.get("answer_ids") or [] for r in rows]
    again = [[tokenizer(tokenizer.decode(i, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
              for i in a] for a in answers]  # fmt: skip
    redo = [[x != y for x, y in zip(a, b)] for a, b in zip(answers, again)]
    return {
        "rows": sum(map(bool, answers)),
        "rows_changed": sum(map(any, redo)),
        "answers": sum(map(len, answers)),
        "answers_changed": sum(map(sum, redo)),
        "tokens": sum(len(i) for a in answers for i in a),
        "tokens_changed": sum(changed_tokens(x, y) for a, b in zip(answers, again) for x, y in zip(a, b)),
        # served without token ids: their ids are the text re-tokenized, a round trip the count cannot see
        "rows_retokenized": sum((r.get("gen") or {}).get("answer_ids") == "text" for r in rows),
    }


def write_roundtrip(out: Path, tokenizer) -> dict:
    """Write :func:`roundtrip_changes` to ``roundtrip.json`` and say it on stderr."""
    c = roundtrip_changes(out, tokenizer)
    (out / ROUNDTRIP).write_text(json.dumps(c, indent=1) + "\n")
    n = c["rows_retokenized"]
    unseen = (
        f"; {n} rows hold the server's text re-tokenized, not its generated ids (it sent none)" if n else ""
    )
    print(
        f"distill: {c['rows_changed']} of {c['rows']} rows ({c['tokens_changed']} of {c['tokens']} tokens) "
        f"tokenize differently once decoded{unseen}",
        file=sys.stderr,
    )
    return c
