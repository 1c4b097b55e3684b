"""DFlash formats: z-lab's checkpoint layout imports as the same drafter, the vLLM and SGLang exports
pass the engines' loader rules and import back unchanged, every bad checkpoint is one line, and the
model card names the kind, its measured tau and the serve commands."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import TargetConfig
from draftheads.heads import DFlashDrafter, Drafter
from draftheads.heads.card import model_card
from draftheads.heads.engine.loaders import rules_for, validate_export
from draftheads.heads.export import export, export_drafter
from tests.test_hub_fake import serve_hub

BLOCK, MASK, LAYERS = 4, 5, [1, 2, 3]  # tiny-llama has 4 layers: feature layers 1..3


def dflash(model, fp, draft_vocab: int | None = None, seed: int = 0) -> DFlashDrafter:
    """A two-layer DFlash drafter for ``model`` with random weights (norms included), attached."""
    d = DFlashDrafter(
        fp,
        model.config.to_dict(),
        mask_token_id=MASK,
        block_size=BLOCK,
        num_decoder_layers=2,
        feature_layers=LAYERS,
        draft_vocab_size=draft_vocab,
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    if draft_vocab:
        d.set_vocab(torch.arange(0, 3 * draft_vocab, 3))
    return d.attach(model).eval()


@torch.no_grad()
def block_logits(d: DFlashDrafter, model, context: int = 9) -> torch.Tensor:
    """Draft logits of one block after ``context`` target positions (the decoder's arithmetic)."""
    ids = torch.arange(3, 3 + context)[None] * 7 % 200
    hidden = model(ids, output_hidden_states=True).hidden_states
    positions = torch.arange(context + BLOCK)[None]
    kv = d.context_kv(d.select_features(hidden), positions[:, :context])
    mask = torch.ones(1, 1, BLOCK, context + BLOCK, dtype=torch.bool)
    return d.logits(d(d.block_inputs(ids[:, -1]), positions[:, context:], kv, mask))


def same(a: Drafter, b: Drafter, model) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return (
        sa.keys() == sb.keys()
        and all(torch.equal(sa[k], sb[k]) for k in sa)
        and torch.equal(block_logits(a, model), block_logits(b, model))
    )


def zlab_config(d: DFlashDrafter, **changes) -> dict:
    """The config.json z-lab's DFlashDraftModel.save_pretrained writes (a Qwen3 config), for ``d``."""
    fp, shape = d.target_fingerprint, d.layer_shape
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": d.block_size,
        "dflash_config": {"mask_token_id": d.mask_token_id, "target_layer_ids": [i - 1 for i in LAYERS]},
        "head_dim": shape["head_dim"],
        "hidden_act": "silu",
        "hidden_size": fp.hidden_size,
        "intermediate_size": shape["intermediate_size"],
        "layer_types": ["full_attention"] * d.num_decoder_layers,
        "max_position_embeddings": shape["max_position_embeddings"],
        "num_attention_heads": shape["num_attention_heads"],
        "num_hidden_layers": d.num_decoder_layers,
        "num_key_value_heads": shape["num_key_value_heads"],
        "num_target_layers": fp.num_layers,
        "rms_norm_eps": shape["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": shape["rope_parameters"]["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "vocab_size": fp.vocab_size,
    }
    cfg.update(changes)
    return cfg


def write_zlab(d: DFlashDrafter, out, prefix: str = "", config: dict | None = None, tensors=None):
    """A checkpoint in z-lab's layout from our module: its tensors (optionally under ``prefix``),
    without the vocabulary maps, beside a z-lab config.json."""
    out.mkdir(parents=True, exist_ok=True)
    sd = tensors or {prefix + k: v for k, v in d.state_dict().items() if k not in ("d2t", "t2d")}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config or zlab_config(d)))
    return out


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ---- import ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["as-saved", "model-prefix", "newer-config"])
def test_zlab_layout_imports_as_the_same_drafter(tmp_path, tiny_llama, variant):
    """z-lab's layout (plain, under ``model.``, or the newer config with block_size inside
    dflash_config and rope_parameters) loads as the drafter it was written from."""
    model, tok, fp = tiny_llama
    d = dflash(model, fp)
    config = zlab_config(d)
    if variant == "newer-config":
        theta = config.pop("rope_theta")
        config.pop("rope_scaling")
        config["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
        config["dflash_config"]["block_size"] = config.pop("block_size")
    src = write_zlab(d, tmp_path / "zlab", "model." if variant == "model-prefix" else "", config)
    back = Drafter.from_pretrained(src, target=model, tokenizer=tok)
    assert isinstance(back, DFlashDrafter) and back.kind == "dflash"
    assert back.feature_layers() == LAYERS  # target_layer_ids [0, 1, 2] are layer outputs: ours - 1
    assert (back.block_size, back.mask_token_id, back.num_decoder_layers) == (BLOCK, MASK, 2)
    assert back.layer_shape == d.layer_shape
    assert same(back, d, model)
    assert back.provenance["imported_from"]["layout"] == "dflash"


def test_zlab_default_layer_ids_when_the_config_lists_none(tmp_path, tiny_llama):
    """Without target_layer_ids z-lab's rule applies: a one-layer drafter reads the middle layer's output."""
    model, tok, fp = tiny_llama
    d = DFlashDrafter(fp, model.config.to_dict(), mask_token_id=MASK, block_size=BLOCK, feature_layers=[3])
    config = zlab_config(d, num_hidden_layers=1, layer_types=["full_attention"])
    config["dflash_config"] = {"mask_token_id": MASK}
    back = Drafter.from_pretrained(write_zlab(d, tmp_path / "z", config=config), target=model, tokenizer=tok)
    assert back.feature_layers() == [fp.num_layers // 2 + 1]  # output of layer L // 2 = input of the next


def test_zlab_repo_on_the_hub_imports_without_running_its_code(monkeypatch, tmp_path, tiny_llama):
    """A z-lab repo (config.json, model.safetensors and its dflash.py) loads by hub id; the remote
    code in dflash.py is never imported."""
    from huggingface_hub import CommitOperationAdd, HfApi

    model, tok, fp = tiny_llama
    d = dflash(model, fp)
    src = write_zlab(d, tmp_path / "zlab")
    hub = serve_hub(monkeypatch, tmp_path)
    try:
        api = HfApi(token="hf_fake")
        api.create_repo("z-lab/tiny-DFlash-b4")
        files = {"config.json": src / "config.json", "model.safetensors": src / "model.safetensors"}
        ops = [CommitOperationAdd(name, str(path)) for name, path in files.items()]
        ops.append(CommitOperationAdd("dflash.py", b"raise SystemExit('remote code must never run')\n"))
        api.create_commit("z-lab/tiny-DFlash-b4", ops, commit_message="drafter")
        back = Drafter.from_pretrained("z-lab/tiny-DFlash-b4", target=model, tokenizer=tok)
    finally:
        hub.__exit__(None, None, None)
    assert same(back, d, model) and back.provenance["imported_from"]["source"] == "z-lab/tiny-DFlash-b4"


def test_an_embedding_or_lm_head_copy_must_be_the_targets(tmp_path, tiny_llama):
    """Copies of the shared embedding and lm_head are checked against the target and dropped."""
    model, tok, fp = tiny_llama
    d = dflash(model, fp)
    sd = {k: v for k, v in d.state_dict().items() if k not in ("d2t", "t2d")}
    sd["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    sd["lm_head.weight"] = model.get_output_embeddings().weight.detach().clone()
    back = Drafter.from_pretrained(write_zlab(d, tmp_path / "ok", tensors=sd), target=model, tokenizer=tok)
    assert same(back, d, model)
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
    with pytest.raises(UserError, match="not the target's lm_head") as e:
        Drafter.from_pretrained(write_zlab(d, tmp_path / "own-head", tensors=sd), target=model, tokenizer=tok)
    one_line(e)


def mutate_config(**changes):
    return lambda d, cfg, sd: cfg.update(changes)


def mutate_dflash(**changes):
    return lambda d, cfg, sd: cfg["dflash_config"].update(changes)


def drop_dflash(key):
    return lambda d, cfg, sd: cfg["dflash_config"].pop(key)


def mutate_tensors(fn):
    return lambda d, cfg, sd: fn(sd)


BAD_CHECKPOINTS = [
    ("hidden-size", mutate_config(hidden_size=32), "hidden size 32"),
    ("vocab", mutate_config(vocab_size=1234), "vocabulary size 1234"),
    ("depth", mutate_config(num_target_layers=36), "layer count 36"),
    ("layer-beyond", mutate_dflash(target_layer_ids=[0, 1, 3]), r"outside 0\.\.2"),
    ("layer-unsorted", mutate_dflash(target_layer_ids=[1, 0, 2]), "ascending"),
    ("mask-outside", mutate_dflash(mask_token_id=10**6), "mask_token_id=1000000 is not a token id"),
    ("mask-missing", drop_dflash("mask_token_id"), "names no dflash_config.mask_token_id"),
    ("block-1", mutate_config(block_size=1), "block_size=1 must be an integer of at least 2"),
    ("block-str", mutate_config(block_size="16"), "block_size='16' must be an integer"),
    ("block-bool", mutate_config(block_size=True), "block_size=True must be an integer"),
    ("sliding", mutate_config(layer_types=["sliding_attention", "full_attention"]), "sliding_attention"),
    ("causal", mutate_dflash(causal=True), "causal=true"),
    ("damaged", mutate_config(layer_types=["full_attention"]), "not a valid Qwen3 config"),
    ("missing-tensor", mutate_tensors(lambda sd: sd.pop("hidden_norm.weight")), "missing"),
    (
        "extra-tensor",
        mutate_tensors(lambda sd: sd.update({"layers.0.gate.weight": torch.zeros(2)})),
        "unexpected",
    ),
    (
        "d2t-without-head",
        mutate_tensors(lambda sd: sd.update({"d2t": torch.zeros(8, dtype=torch.long)})),
        "no lm_head",
    ),
]


@pytest.mark.parametrize("name,mutate,match", BAD_CHECKPOINTS, ids=[b[0] for b in BAD_CHECKPOINTS])
def test_bad_dflash_checkpoints_are_one_line(tmp_path, tiny_llama, name, mutate, match):
    """A checkpoint for another target, a bad mask token or block size, unsupported layers, and
    missing or extra tensors: one line each, and the files are left as they were."""
    model, tok, fp = tiny_llama
    d = dflash(model, fp)
    cfg = zlab_config(d)
    sd = {k: v for k, v in d.state_dict().items() if k not in ("d2t", "t2d")}
    mutate(d, cfg, sd)
    src = write_zlab(d, tmp_path / name, config=cfg, tensors=sd)
    before = {f.name: f.read_bytes() for f in src.iterdir()}
    with pytest.raises(UserError, match=match) as e:
        Drafter.from_pretrained(src, target=model, tokenizer=tok)
    assert str(src) in one_line(e)
    assert {f.name: f.read_bytes() for f in src.iterdir()} == before


# ---- export -----------------------------------------------------------------------------------------
def read(out) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_export_passes_the_engine_rules_and_imports_back(tmp_path, tiny_llama, engine):
    model, tok, fp = tiny_llama
    d = dflash(model, fp)
    out = export_drafter(d, engine, tmp_path / engine)  # validated against FORMATS and RULES
    cfg, sd = read(out)
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    # Both engines read target_layer_ids as layer outputs: vLLM adds 1, SGLang captures id + 1.
    assert cfg["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 1, 2]}
    assert cfg["block_size"] == BLOCK and cfg["num_target_layers"] == fp.num_layers
    assert cfg["layer_types"] == ["full_attention"] * 2 and cfg["rope_theta"] > 0
    assert "draft_vocab_size" not in cfg and "eagle_aux_hidden_state_layer_ids" not in cfg
    own = {k: v for k, v in d.state_dict().items() if k not in ("d2t", "t2d")}
    assert sd.keys() == own.keys() and all(torch.equal(sd[k], own[k]) for k in own)
    assert not any(k.startswith("model.") or "embed_tokens" in k or "lm_head" in k for k in sd)
    method = "dflash" if engine == "vllm" else "DFLASH"
    assert validate_export(out, engine, fp.num_layers).method == method
    named = {r.name: r.sources for r in rules_for(engine, method)}
    assert "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py" in named["dflash-layer-ids"]
    assert "sglang/srt/speculative/dflash_utils.py" in named["dflash-layer-ids"]
    back = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert same(back, d, model)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda c: c.pop("rope_theta"), "lacks rope_theta"),
        (lambda c: c.update(layer_types=["sliding_attention"] * 2), "non-causal full attention"),
        (lambda c: c["dflash_config"].update(target_layer_ids=[0, 1, 3]), r"layer outputs in 0\.\.2"),
        (lambda c: c["dflash_config"].update(mask_token_id=-1), "mask_token_id=-1"),
        (lambda c: c.update(block_size=1), "block_size=1"),
        (lambda c: c.update(hidden_act="gelu"), "SiLU-gated only"),
        (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]), "must not set eagle_aux"),
    ],
)
def test_engine_rules_catch_a_broken_export(tmp_path, tiny_llama, change, match):
    """Each DFlash loader rule bites, naming the engine file it comes from."""
    model, tok, fp = tiny_llama
    out = export_drafter(dflash(model, fp), "vllm", tmp_path / "x")
    cfg = json.loads((out / "config.json").read_text())
    change(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=match) as e:
        validate_export(out, "vllm", fp.num_layers)
    one_line(e)


def test_reduced_vocabulary_goes_to_vllm_only(tmp_path, tiny_llama):
    """vLLM reads a reduced vocabulary (draft_vocab_size, the target's lm_head rows, d2t); SGLang
    drafts with the target's full lm_head, so that export is refused in one line."""
    model, tok, fp = tiny_llama
    d = dflash(model, fp, draft_vocab=40)
    out = export_drafter(d, "vllm", tmp_path / "vllm")
    cfg, sd = read(out)
    ids = torch.arange(0, 120, 3)
    assert cfg["draft_vocab_size"] == 40 and sd["d2t"].dtype == torch.int64
    assert torch.equal(torch.arange(40) + sd["d2t"], ids)
    assert torch.equal(sd["lm_head.weight"], model.get_output_embeddings().weight.detach()[ids])
    back = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert back.draft_vocab_size == 40 and same(back, d, model)
    with pytest.raises(UserError, match="draft.dflash.draft_vocab_size=null") as e:
        export_drafter(d, "sglang", tmp_path / "sglang")
    one_line(e)
    assert not (tmp_path / "sglang").exists()


def export_config(heads, engine: str, out) -> Config:
    cfg = Config(heads=str(heads), format=engine, out=str(out))
    cfg.target = TargetConfig(name_or_path="tiny-llama", tiny="llama")
    return cfg


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_export_prints_the_serve_command_for_the_block(tmp_path, tiny_llama, engine, capsys):
    """num_speculative_tokens is block_size - 1 for vLLM; SGLang's draft-token count is the block."""
    model, tok, fp = tiny_llama
    heads = dflash(model, fp).save_pretrained(tmp_path / "heads")
    export(export_config(heads, engine, tmp_path / "out"))
    printed = capsys.readouterr().out
    if engine == "vllm":
        assert '"method": "dflash"' in printed and f'"num_speculative_tokens": {BLOCK - 1}' in printed
        assert "--attention-backend FLASH_ATTN" in printed  # the block's non-causal attention
    else:
        assert "--speculative-algorithm DFLASH" in printed
        assert f"--speculative-num-draft-tokens {BLOCK}" in printed


def test_sglang_refuses_a_reduced_vocabulary_before_loading_the_target(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    heads = dflash(model, fp, draft_vocab=40).save_pretrained(tmp_path / "heads")
    cfg = export_config(heads, "sglang", tmp_path / "out")
    cfg.target = TargetConfig(name_or_path=str(tmp_path / "no-such-target"))  # never loaded
    with pytest.raises(UserError, match="format=vllm") as e:
        export(cfg)
    one_line(e)
    assert not (tmp_path / "out").exists()


# ---- model card -----------------------------------------------------------------------------------
def test_push_writes_a_dflash_card_with_the_measured_tau(monkeypatch, tmp_path, tiny_llama):
    from draftheads.heads.hub import push_folder

    model, tok, fp = tiny_llama
    heads = dflash(model, fp).save_pretrained(tmp_path / "heads")
    (heads / "report.json").write_text(json.dumps({"tau": 3.37, "speedup": 1.92, "heads": str(heads)}))
    hub = serve_hub(monkeypatch, tmp_path)
    try:
        push_folder(heads, "org/tiny-dflash")
        files = hub.repos["org/tiny-dflash"].commits[hub.repos["org/tiny-dflash"].branches["main"]]
    finally:
        hub.__exit__(None, None, None)
    card = ModelCard(files["README.md"].decode())
    assert "dflash" in card.data.to_dict()["tags"]
    text = card.text
    assert "3.37" in text and "1.92×" in text
    assert f"blocks of {BLOCK} tokens" in text and f"mask token {MASK}" in text and f"layers {LAYERS}" in text
    assert '"method": "dflash"' in text and f'"num_speculative_tokens": {BLOCK - 1}' in text
    assert "--speculative-algorithm DFLASH" in text and f"--speculative-num-draft-tokens {BLOCK}" in text
    assert "### vLLM" in text and "### SGLang" in text


def test_card_of_a_reduced_vocabulary_drafter_names_vllm_only(tiny_llama):
    model, tok, fp = tiny_llama
    text = model_card(dflash(model, fp, draft_vocab=40).config_dict(), "org/x").text
    assert "draft vocabulary 40" in text and '"method": "dflash"' in text
    assert "--speculative-algorithm DFLASH" not in text and "draft.dflash.draft_vocab_size=null" in text


def test_info_imports_an_export_onto_the_named_target(tmp_path, tiny_llama, capsys):
    from draftheads.conf.cli import main

    model, tok, fp = tiny_llama
    heads = dflash(model, fp).save_pretrained(tmp_path / "heads")
    export(export_config(heads, "vllm", tmp_path / "out"))
    capsys.readouterr()
    assert main(["info", f"heads={tmp_path / 'out'}", "target=tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert "as kind: dflash" in out and f'"block_size": {BLOCK}' in out and fp.tokenizer_hash in out
    assert "layers.0.self_attn.q_proj.weight" in out
