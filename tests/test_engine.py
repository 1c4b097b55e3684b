"""vLLM, the real engine, serves draftheads' exports: the oracle for every export format.

Run by ``make test-engine`` (marked ``engine``, so ``make test`` leaves them out). vLLM's CPU
build lives in its own environment (``make engine``: ``.venv-engine``); the module exports with
draftheads here, then runs every serve command the exports printed through the package's job
runner (``draftheads/bench/engine_job.py``) in that environment, all in one engine process, one
engine after another (vLLM is imported once), and the tests compare:

- plain vLLM greedy with the target's greedy here;
- for EAGLE-3 and DFlash in ``format=vllm`` and ``format=speculators``, P-EAGLE in
  ``format=speculators`` (vLLM drafts its group in one pass), Medusa and EAGLE-1 in
  ``format=vllm``: vLLM's output with the
  target's greedy, and vLLM's acceptance counters (drafting steps, accepted tokens, accepted per
  chain position) with draftheads' decoder running the same chain on the same token ids;
- a deliberately broken export (a shifted ``d2t``, a dropped norm): the counters no longer agree;
- ``draftheads engine`` itself: its record holds vLLM's counters equal to draftheads'.

The target is a tiny random Llama with head size 32 (vLLM's CPU attention needs at least 32)
steered to a wide-margin greedy text, token t -> t + 1, so that float rounding in either engine
cannot flip a token. The drafters are trained here for a few seconds on that text, until every
chain position is accepted sometimes and rejected sometimes (P-EAGLE's draft vocabulary lacks
every 7th id for that), so the counters compare both outcomes at every depth.
"""

from __future__ import annotations

import contextlib
import io
import sys
from functools import cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from draftheads.bench.engine_acceptance import (
    counted,
    engine_missing,
    engine_python,
    our_counters,
    run_engines,
)
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from draftheads.heads import Drafter
from draftheads.heads.export import export

pytestmark = pytest.mark.engine

# this machine's limits for the engine, added to every serve command (none is about the drafter):
# float32 as draftheads computes, a small KV cache and no compilation (a CPU start takes minutes)
ENGINE = {
    "dtype": "float32",
    "max_model_len": 256,
    "kv_cache_memory_bytes": 128 * 2**20,
    "enforce_eager": True,
}
NEW = 24  # tokens generated per prompt
CHAIN = 3  # EAGLE-3 drafted tokens per step; DFlash drafts block - 1
BLOCK = 4
VOCAB_RANGE = 800  # prompts and training text use ids below this; the continuation stays < 1024


@pytest.fixture(scope="module", autouse=True)
def needs_engine():
    reason = engine_missing(engine_python())
    if reason:
        print(f"skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)


# ---- the target and its drafters -------------------------------------------------------------------
@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(folder, model, tokenizer): a tiny Llama of head size 32 whose greedy text is t -> t + 1,
    saved as a user would serve it and loaded back from there as draftheads loads a target."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftheads.heads.target.load import load_target, load_tokenizer

    tok = load_tokenizer(TargetConfig(name_or_path="tiny-llama", tiny="llama"))
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tok),
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # the embedding dominates every layer; lm_head row t + 1 reads embedding t
        emb = model.get_input_embeddings().weight
        emb.mul_(100.0)
        model.lm_head.weight.copy_(F.normalize(emb, dim=-1).roll(1, dims=0) * 10.0)
    folder = tmp_path_factory.mktemp("engine") / "tiny-llama-h32"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg = TargetConfig(name_or_path=str(folder))
    loaded, tok = load_target(cfg)
    return folder, loaded, tok


def successor_rows(g: torch.Generator, n: int = 4, length: int = 48) -> dict[str, torch.Tensor]:
    """Training rows as the target writes them: 8 random prompt tokens, then t + 1, t + 2, ..."""
    ids = torch.randint(10, VOCAB_RANGE, (n, length), generator=g)
    ids[:, 8:] = ids[:, 7:8] + torch.arange(1, length - 7)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, 8:] = 1
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}


def trained(
    target, draft: DraftConfig, steps: int, lr: float, out: Path, vocab_gap: int = 0
) -> tuple[Drafter, Path]:
    """A drafter of ``draft`` trained by draftheads' own objective on the target's text, and the
    folder ``out`` it is saved in. With ``vocab_gap`` = k, a reduced draft vocabulary lacks every
    k-th id of the text's range, as one built from data can lack tokens: the drafter never drafts
    them, so it is rejected at every chain position now and then, however well it is trained."""
    from draftheads.train.drafters import build_drafter, build_objective, init_drafter_weights

    folder, model, tok = target
    cfg = Config(target=TargetConfig(name_or_path=str(folder)), draft=draft)
    torch.manual_seed(0)
    drafter = build_drafter(cfg, model, tok)
    ids = torch.tensor([i for i in range(1200) if i % vocab_gap]) if vocab_gap else torch.arange(1024)
    vocab_rows = [{"input_ids": ids, "loss_mask": torch.ones(len(ids))}]
    init_drafter_weights(drafter, model, draft, vocab_rows, 0)
    objective = build_objective(drafter, model, draft, topk=1)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        loss, _ = objective(successor_rows(g))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    drafter.eval().save_pretrained(out)
    return drafter, out


@pytest.fixture(scope="module")
def eagle3(target, tmp_path_factory):
    draft = DraftConfig.of(
        kind="eagle", version=3, draft_vocab_size=1024, ttt_steps=CHAIN, feature_loss_weight=0.0
    )
    return trained(target, draft, steps=60, lr=3e-3, out=tmp_path_factory.mktemp("eagle3") / "drafter")


@pytest.fixture(scope="module")
def eagle1(target, tmp_path_factory):
    draft = DraftConfig.of(kind="eagle", version=1, ttt_steps=CHAIN, feature_loss_weight=1.0, fc_bias=False)
    return trained(target, draft, steps=21, lr=3e-3, out=tmp_path_factory.mktemp("eagle1") / "drafter")


@pytest.fixture(scope="module")
def medusa(target, tmp_path_factory):
    draft = DraftConfig.of(kind="medusa", num_heads=CHAIN, num_layers=1, lm_head="copy")
    return trained(target, draft, steps=100, lr=1e-2, out=tmp_path_factory.mktemp("medusa") / "drafter")


@pytest.fixture(scope="module")
def peagle(target, tmp_path_factory):
    """Its first slot learns the text long before its parallel ones do: trained until the third
    is accepted now and then, it no longer misses the first, so its vocabulary lacks every 7th id."""
    draft = DraftConfig.of(kind="peagle", draft_vocab_size=1024, num_depths=CHAIN)
    out = tmp_path_factory.mktemp("peagle") / "drafter"
    return trained(target, draft, steps=900, lr=1e-2, out=out, vocab_gap=7)


@pytest.fixture(scope="module")
def dflash(target, tmp_path_factory):
    draft = DraftConfig.of(
        kind="dflash", block_size=BLOCK, num_decoder_layers=1, draft_vocab_size=1024, anchors_per_row=16
    )
    return trained(target, draft, steps=800, lr=1e-2, out=tmp_path_factory.mktemp("dflash") / "drafter")


PROMPTS = torch.randint(10, VOCAB_RANGE - NEW, (4, 12), generator=torch.Generator().manual_seed(7)).tolist()


@cache
def greedy(model) -> list[list[int]]:
    """The target's own greedy continuation of each prompt (transformers' generate)."""
    outs = []
    for p in PROMPTS:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
        outs.append(out[0, len(p) :].tolist())
    return outs


def export_command(heads: Path, fmt: str, out: Path, folder: Path, verifier: Path | None = None) -> str:
    """Export ``heads`` as the command line does; returns the serve command it printed."""
    cfg = Config(heads=str(heads), format=fmt, out=str(out), target=TargetConfig(name_or_path=str(folder)))
    cfg.verifier = str(verifier) if verifier else None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        export(cfg)
    lines = printed.getvalue().splitlines()
    return next(lines[i + 1] for i, line in enumerate(lines) if line.endswith("serve it with:")).strip()


def shift_d2t(export: Path) -> None:
    """Every draft token maps to the next target token."""
    edit_weights(export, lambda sd: sd.update(d2t=sd["d2t"] + 1))


def drop_norm(export: Path) -> None:
    """The final norm as an engine fills one an export left out: all ones."""
    edit_weights(export, lambda sd: sd.update(**{"norm.weight": torch.ones_like(sd["norm.weight"])}))


def edit_weights(export: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    weights = export / "model.safetensors"
    sd = load_file(str(weights))
    change(sd)
    save_file(sd, str(weights))


# (drafter, format) served by vLLM with counters compared to draftheads'
CASES = [
    ("eagle3", "vllm"),
    ("eagle3", "speculators"),
    ("dflash", "vllm"),
    ("dflash", "speculators"),
    ("peagle", "speculators"),  # vLLM drafts its group in one pass (parallel_drafting)
    ("medusa", "vllm"),  # each head's top token: a chain of num_heads
    ("eagle1", "vllm"),  # fc without a bias: vLLM's EAGLE-1 layer has none
]
BREAKAGES = {f.__name__: f for f in (shift_d2t, drop_norm)}  # applied to the EAGLE-3 vllm export


@pytest.fixture(scope="module")
def smollm2_chats(smollm2) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, greedy): two chat-templated prompts for the embedded SmolLM2 and its own greedy
    continuation of each (transformers' generate)."""
    model, tok = smollm2
    messages = ["What is 12 times 7?", "Name three colours."]
    chats = [[{"role": "user", "content": m}] for m in messages]
    prompts = [
        list(tok.apply_chat_template(c, add_generation_prompt=True, return_dict=True)["input_ids"])
        for c in chats
    ]
    want = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
        want.append(out[0, len(p) :].tolist())
    return prompts, want


@pytest.fixture(scope="module")
def served(target, smollm2_chats, request, tmp_path_factory) -> dict[str, dict]:
    """vLLM's report (outputs and counters, or the error it raised) for every serve command of
    this module, by name: ``plain`` (the target alone), ``smollm2`` (the embedded target's
    converted folder), ``KIND-FORMAT`` for each of ``CASES`` and each of ``BREAKAGES``; all run
    in one engine process (an engine start costs minutes on a CPU, the import a good part of it)."""
    from draftheads.heads.target.embedded import convert_smollm2

    folder = target[0]
    work = tmp_path_factory.mktemp("served")
    jobs = {
        "plain": (f"vllm serve {folder}", PROMPTS),
        "smollm2": (f"vllm serve {convert_smollm2(TargetConfig())}", smollm2_chats[0]),
    }
    for kind, fmt in CASES:
        heads = request.getfixturevalue(kind)[1]
        verifier = folder if fmt == "speculators" else None
        command = export_command(heads, fmt, work / f"{kind}-{fmt}", folder, verifier)
        assert command.startswith("vllm serve ")
        jobs[f"{kind}-{fmt}"] = (command, PROMPTS)
    heads = request.getfixturevalue("eagle3")[1]
    for name, breakage in BREAKAGES.items():
        command = export_command(heads, "vllm", work / name, folder)
        breakage(work / name)
        jobs[name] = (command, PROMPTS)
    reports = run_engines(list(jobs.values()), NEW, ENGINE, work)
    return dict(zip(jobs, reports))


def every_position_decides(counters: dict) -> bool:
    """Whether each chain position was reached and accepted sometimes, and reached and rejected
    sometimes: then equal counters say that the engines agree at every depth, both ways."""
    accepted = counters["accepted_per_position"]
    reached = [counters["num_drafts"], *accepted[:-1]]
    return all(0 < a < r for a, r in zip(accepted, reached))


def report_of(served: dict[str, dict], name: str) -> dict:
    """The report of the serve command ``name``; one vLLM refused fails here with what it said."""
    report = served[name]
    assert "error" not in report, f"vLLM failed on {name}: {report['error']}"
    return report


# ---- the tests --------------------------------------------------------------------------------------
def test_plain_vllm_greedy_is_the_targets_greedy(target, served):
    _, model, _ = target
    report = report_of(served, "plain")
    assert report["outputs"] == greedy(model)
    assert report["outputs"][0][:3] == [PROMPTS[0][-1] + 1, PROMPTS[0][-1] + 2, PROMPTS[0][-1] + 3]


def test_vllm_serves_the_embedded_target_folder_with_draftheads_greedy(smollm2_chats, served):
    """The embedded SmolLM2, as draftheads converts it into its cache, is what vLLM serves: the
    same greedy tokens as the target draftheads loads (an embedding vLLM could not find would
    leave it uninitialised, and the text would be garbage)."""
    assert report_of(served, "smollm2")["outputs"] == smollm2_chats[1]


@pytest.mark.parametrize(("kind", "fmt"), CASES)
def test_vllm_serves_the_export_with_draftheads_counters(target, kind, fmt, request, served):
    folder, model, tok = target
    drafter, _ = request.getfixturevalue(kind)
    chain = BLOCK - 1 if kind == "dflash" else CHAIN
    ours = our_counters(drafter, model, tok, PROMPTS, chain, NEW)
    assert ours["outputs"] == greedy(model)
    assert every_position_decides(ours)
    report = report_of(served, f"{kind}-{fmt}")
    assert report["outputs"] == greedy(model)
    assert counted(report) == counted(ours)


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_export_is_caught_by_the_counters(target, eagle3, breakage, served):
    """An EAGLE-3 export with a shifted d2t or a dropped norm drafts other tokens: vLLM's output
    stays the target's (verification is lossless), but its counters no longer match draftheads'.

    Shifted feature layers are not among them: this target's scaled embedding dominates every
    layer's residual stream (that is what makes its greedy text wide-margin), so each layer's
    input is nearly the same and a shift drafts the same tokens. The layer ids an export writes
    are checked against each engine's loader rules instead (tests/test_export.py)."""
    folder, model, tok = target
    drafter, _ = eagle3
    report = report_of(served, breakage)
    assert report["outputs"] == greedy(model)
    assert counted(report) != counted(our_counters(drafter, model, tok, PROMPTS, CHAIN, NEW))


def test_the_engine_command_records_vllms_counters_equal_to_draftheads(target, eagle3, capsys):
    """``draftheads engine`` on the tiny target and the trained EAGLE-3 drafter, in speculators'
    format with a chain shorter than the model card's: the record it returns and prints holds
    vLLM's counters equal to draftheads', and both engines' outputs are the target's greedy."""
    from draftheads.bench.engine_compare import engine
    from draftheads.conf.commands.args import EngineArgs, EngineOptions
    from draftheads.conf.schema.decode import DecodeConfig

    folder, model, tok = target
    _, heads = eagle3
    opts = EngineOptions(prompts="heldout", max_prompts=3, format="speculators", chain=CHAIN - 1)
    args = EngineArgs(
        target=TargetConfig(name_or_path=str(folder)),
        decode=DecodeConfig(max_new_tokens=NEW, backend="eager"),
        heads=str(heads),
        engine=opts,
    )
    record = engine(args)
    printed = capsys.readouterr().out
    theirs, ours = record["vllm"]["speculators"], record["draftheads"]
    assert record["chain"] == CHAIN - 1 and len(ours["accepted_per_position"]) == CHAIN - 1
    assert counted(theirs) == counted(ours)
    assert theirs["counters_equal"] is True
    assert 0 < ours["num_accepted_tokens"] < ours["num_draft_tokens"]
    assert theirs["greedy_outputs"] == ours["greedy_outputs"] == 3
    assert theirs["outputs"] == ours["outputs"] == record["greedy"]
    row = next(line for line in printed.splitlines() if line.startswith("vLLM, format=speculators"))
    assert f"{theirs['mean_acceptance_length']:.2f}" in row and row.split()[-1] == "yes"
