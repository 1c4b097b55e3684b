"""vLLM serves EAGLE-3 exports of targets of many architectures, counting as draftheads counts.

Run by ``make test-engine`` (marked ``engine``; ``make test`` leaves them out). For each
architecture below, a tiny random target of head size 32 (vLLM's CPU attention needs at least
32; the project's ``target.tiny`` configs have 16) is steered to the wide-margin greedy text of
``tests/test_engine.py`` (token t -> t + 1) and saved as a user would serve it; an EAGLE-3
drafter (Llama layers sized from the target's config) is trained on that text by draftheads'
own objective and exported with ``format=vllm`` and with ``format=speculators``, and vLLM
serves each export. vLLM's greedy output must be the target's, and its acceptance counters
(drafting steps, drafted and accepted tokens, accepted per chain position) must equal those of
draftheads' decoder running the same chain on the same token ids. All the architectures' engines run in one engine process, one after
another (:func:`~draftheads.bench.engine_acceptance.run_engines`): one vLLM import, not one per
architecture.

Served with equal counters: llama, mistral, qwen2, qwen3, qwen3_moe, phi3, granite, olmo2 (vLLM
runs it through its transformers backend), gpt_oss (sliding windows of 8 on alternate layers) and
llama4_text (chunks of 32; ``--block-size 32`` added to its serve command). Left out, with what
vLLM 0.32 (CPU) said:

- mixtral, gemma3_text, cohere2, glm4_moe: "Model does not support EAGLE3 interface but
  aux_hidden_state_outputs was requested" (vLLM's model class cannot hand over hidden states).
- gemma2: "There is no module or parameter named 'lm_head' in Gemma2ForCausalLM" (vLLM ties
  Gemma-2's head to its embedding whatever the config says; nor does it have EAGLE-3's interface).
- deepseek_v3: "No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])": the
  target's latent attention and the drafter's Llama attention cannot share a KV cache on a CPU.

Mistral runs with its default window (4096, beyond the text), where its tiny target counts as
the Llama one does (the same counters): what it adds is vLLM's Mistral class and config path.
With a window the text crosses (8), vLLM's counters differ from draftheads' (the last test):
when every layer of a target slides, vLLM makes that window the engine's
(``CacheConfig.sliding_window``), which then reaches the drafter's layer too, while draftheads'
drafter attends to the whole text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from draftheads.bench.engine_acceptance import counted, our_counters, run_engines
from draftheads.conf.schema.heads import DraftConfig, TargetConfig
from tests.test_engine import (  # noqa: F401  (needs_engine: skip without vLLM, as there)
    CHAIN,
    ENGINE,
    NEW,
    PROMPTS,
    every_position_decides,
    export_command,
    greedy,
    needs_engine,
    trained,
)

pytestmark = pytest.mark.engine

WINDOW = 8  # sliding windows: the 12-token prompts already cross them
CHUNK = 32  # Llama-4's attention chunks: vLLM needs them a multiple of its KV block (32 here)
SLIDING_THEN_FULL = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
# every target: 4 layers of width 128, 4 query and 2 key/value heads of size 32
BASE: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
# architecture (transformers' model_type) -> what its tiny target adds to BASE
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},  # its default window, 4096 as Mistral-7B-v0.1 ships: see the module docstring
    "qwen2": dict(use_sliding_window=False),
    "qwen3": dict(head_dim=32),
    "qwen3_moe": dict(head_dim=32, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2),
    "phi3": {},
    "granite": {},
    "olmo2": {},
    "gpt_oss": dict(
        head_dim=32,
        sliding_window=WINDOW,
        layer_types=SLIDING_THEN_FULL,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "llama4_text": dict(
        head_dim=32,
        intermediate_size_mlp=256,
        attention_chunk_size=CHUNK,
        num_local_experts=4,
        num_experts_per_tok=1,
        layer_types=["chunked_attention"] * 3 + ["full_attention"],
    ),
}
# (name -> architecture, what it adds to BASE): served too, to show where vLLM and draftheads
# part (module docstring); compared in the vllm format only
APART = {"mistral_window8": ("mistral", dict(sliding_window=WINDOW))}
# The embedding is scaled so far above what any layer adds to the residual stream (post-norm
# layers such as OLMo-2's add a whole normed vector each) that the stream stays the embedding.
EMBEDDING_SCALE = 1000.0
# transformers has no sdpa attention for GPT-OSS (its sinks), and words the refusal without "sdpa"
EAGER = {"gpt_oss"}
# what a served architecture adds to its serve command: vLLM's chunked attention needs chunks that
# are a multiple of the KV block, whose CPU default (128) is longer than the test's text
FLAGS = {"llama4_text": f" --block-size {CHUNK}"}
FORMATS = ("vllm", "speculators")  # speculators' is exported with verifier=the target's folder


def steered_target(arch: str, extra: dict[str, Any], tok, folder: Path) -> tuple[Path, Any, Any]:
    """(folder, model, tokenizer): a tiny random target of ``arch`` (``extra`` added to ``BASE``)
    whose greedy text is t -> t + 1
    by a wide margin (lm_head row t + 1 reads the scaled embedding of t), saved in ``folder`` as a
    user would serve it and loaded back from there as draftheads loads a target."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftheads.heads.target.load import load_target

    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tok),
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **{**BASE, **extra},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.mul_(EMBEDDING_SCALE)
        model.lm_head.weight.copy_(F.normalize(emb, dim=-1).roll(1, dims=0) * 10.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    attention = "eager" if arch in EAGER else "sdpa"
    loaded, tok = load_target(TargetConfig(name_or_path=str(folder), attn_implementation=attention))
    return folder, loaded, tok


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Per architecture: the target's greedy text, draftheads' counters, and per format vLLM's
    report (its outputs and counters, or the one-line error it raised) on the EAGLE-3 export; all
    the engines started one after another in one engine process."""
    from draftheads.heads.target.load import load_tokenizer

    tok = load_tokenizer(TargetConfig(name_or_path="tiny-llama", tiny="llama"))
    draft = DraftConfig.of(
        kind="eagle", version=3, draft_vocab_size=1024, ttt_steps=CHAIN, feature_loss_weight=0.0
    )
    runs, jobs, names = {}, [], []
    cases = {name: (name, extra, FORMATS) for name, extra in ARCHITECTURES.items()}
    cases.update({name: (arch, extra, ("vllm",)) for name, (arch, extra) in APART.items()})
    for name, (arch, extra, formats) in cases.items():
        work = tmp_path_factory.mktemp(name)
        target = steered_target(arch, extra, tok, work / "target")
        folder, model, tok = target
        drafter, heads = trained(target, draft, steps=60, lr=3e-3, out=work / "drafter")
        ours = our_counters(drafter, model, tok, PROMPTS, CHAIN, NEW)
        runs[name] = {"greedy": greedy(model), "ours": ours, "vllm": {}}
        for fmt in formats:
            verifier = folder if fmt == "speculators" else None
            command = export_command(heads, fmt, work / fmt, folder, verifier) + FLAGS.get(arch, "")
            jobs.append((command, PROMPTS))
            names.append((name, fmt))
    reports = run_engines(jobs, NEW, ENGINE, tmp_path_factory.mktemp("vllm"))
    for (name, fmt), report in zip(names, reports):
        runs[name]["vllm"][fmt] = report
    return runs


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_vllm_serves_the_eagle3_export_with_draftheads_counters(served, arch, fmt):
    run = served[arch]
    ours, theirs = run["ours"], run["vllm"][fmt]
    assert run["greedy"][0][:3] == [PROMPTS[0][-1] + 1, PROMPTS[0][-1] + 2, PROMPTS[0][-1] + 3]
    assert ours["outputs"] == run["greedy"]
    assert every_position_decides(ours)  # each depth accepted sometimes, rejected sometimes
    assert "error" not in theirs, theirs.get("error")
    assert theirs["outputs"] == run["greedy"]
    assert counted(theirs) == counted(ours)


def test_vllm_gives_an_all_sliding_targets_window_to_the_drafter(served):
    """Mistral with a window the text crosses (module docstring): vLLM serves the target as
    transformers runs it (the same greedy text), but its drafter sees only the window, so it
    accepts other drafts than draftheads' drafter, which sees the whole text."""
    run = served["mistral_window8"]
    theirs = run["vllm"]["vllm"]
    assert "error" not in theirs, theirs.get("error")
    assert theirs["outputs"] == run["greedy"]
    assert counted(theirs) != counted(run["ours"])
