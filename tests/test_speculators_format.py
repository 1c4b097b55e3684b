"""vLLM's speculators format: EAGLE-3 and DFlash exports import back as the same drafter (equal
logits), bad speculators checkpoints and unexpressible drafters are refused in one line, and,
when the ``speculators`` package is installed, its own config and model classes accept our
export and compute the same logits."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import TargetConfig
from draftheads.heads import Drafter, EagleDrafter
from draftheads.heads.export import export, export_drafter
from tests.test_dflash_formats import BLOCK, LAYERS, MASK, block_logits, dflash
from tests.test_export import eagle


@torch.no_grad()
def eagle3_logits(d: EagleDrafter, model, length: int = 7) -> torch.Tensor:
    """One EAGLE-3 pass over ``length`` positions of fused target features (the decoder's arithmetic)."""
    ids = torch.arange(5, 5 + length)[None] * 11 % 250
    hidden = model(ids, output_hidden_states=True).hidden_states
    positions = torch.arange(length)[None]
    return d.logits(d(ids, d.fuse(d.select_features(hidden)), positions))


def read(out) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))


def write_config(out, cfg: dict) -> None:
    (out / "config.json").write_text(json.dumps(cfg))


def cli(heads, out) -> Config:
    cfg = Config(heads=str(heads), format="speculators", out=str(out))
    cfg.target = TargetConfig(name_or_path="tiny-llama", tiny="llama")
    return cfg


def test_eagle3_export_writes_speculators_names_and_imports_back(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    d = eagle(model, fp, 3, feature_layers=[1, 2, 3])
    out = export_drafter(d, "speculators", tmp_path / "e3")
    cfg, sd = read(out)
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and cfg["draft_vocab_size"] == 300
    assert cfg["target_hidden_size"] == 64 and cfg["norm_before_residual"] is False
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    section = cfg["speculators_config"]
    assert section["algorithm"] == "eagle3" and section["default_proposal_method"] == "greedy"
    assert section["proposal_methods"][0]["speculative_tokens"] == 3
    assert section["verifier"] == {"name_or_path": fp.name, "architectures": [fp.architecture]}
    own = d.state_dict()
    assert torch.equal(sd["layers.0.hidden_norm.weight"], own["hidden_norm.weight"])
    assert not any(k.startswith("midlayer.") for k in sd) and "embed_tokens.weight" not in sd
    back = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert back.feature_layers() == [1, 2, 3]
    assert back.provenance["imported_from"]["layout"] == "speculators-eagle3"
    assert torch.equal(eagle3_logits(back, model), eagle3_logits(d, model))


@pytest.mark.parametrize("draft_vocab", [None, 50])
def test_dflash_export_writes_speculators_fields_and_imports_back(tmp_path, tiny_llama, draft_vocab):
    model, tok, fp = tiny_llama
    d = dflash(model, fp, draft_vocab)
    out = export_drafter(d, "speculators", tmp_path / "df")
    cfg, sd = read(out)
    assert cfg["speculators_model_type"] == "dflash" and cfg["architectures"] == ["DFlashSpeculator"]
    assert cfg["aux_hidden_state_layer_ids"] == LAYERS and cfg["mask_token_id"] == MASK
    assert cfg["block_size"] == BLOCK and cfg["sample_from_anchor"] is False
    assert cfg["draft_vocab_size"] == (draft_vocab or fp.vocab_size)
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == BLOCK - 1
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    reduced = {"lm_head.weight", "d2t", "t2d"}
    assert reduced <= set(sd) if draft_vocab else not reduced & set(sd)
    back = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert back.feature_layers() == LAYERS and back.block_size == BLOCK
    assert torch.equal(block_logits(back, model), block_logits(d, model))


def test_a_speculators_import_re_exports_to_the_same_files(tmp_path, tiny_llama, capsys):
    model, tok, fp = tiny_llama
    first = export_drafter(dflash(model, fp, 50), "speculators", tmp_path / "first")
    again = export(cli(first, tmp_path / "again"))
    assert f"  vllm serve {again}" in capsys.readouterr().out.splitlines()
    (cfg_a, sd_a), (cfg_b, sd_b) = read(first), read(again)
    assert cfg_a == cfg_b and sd_a.keys() == sd_b.keys()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


@pytest.mark.parametrize("kind", ["medusa", "eagle1"])
def test_export_of_a_drafter_speculators_cannot_express_is_refused_before_writing(tmp_path, tiny_llama, kind):
    model, tok, fp = tiny_llama
    src = tmp_path / "src"
    if kind == "medusa":
        from draftheads.heads import MedusaHeads

        MedusaHeads(fp, num_heads=2).save_pretrained(src)
    else:
        eagle(model, fp, 1).save_pretrained(src)
    with pytest.raises(UserError, match="speculators has no model type for"):
        export(cli(src, tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def exported(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    return export_drafter(dflash(model, fp), "speculators", tmp_path / "spec")


@pytest.mark.parametrize(
    "change,match",
    [
        (
            lambda c: c["speculators_config"]["verifier"].update(name_or_path="org/Other-7B"),
            "its verifier is org/Other-7B",
        ),
        (
            lambda c: c["speculators_config"]["verifier"].update(architectures=["GPT2LMHeadModel"]),
            "its verifier is",
        ),
        (lambda c: c.update(speculators_model_type="medusa9"), "unknown speculators_model_type 'medusa9'"),
        (lambda c: c.update(speculators_model_type="mtp"), "speculators_model_type 'mtp' cannot be run"),
        (lambda c: c["speculators_config"].update(default_proposal_method="tree"), "'tree' is not one of"),
        (lambda c: c.update(sample_from_anchor=True), "sample_from_anchor=true"),
    ],
)
def test_bad_speculators_checkpoints_are_refused_in_one_line(tmp_path, tiny_llama, change, match):
    model, tok, _ = tiny_llama
    out = exported(tmp_path, tiny_llama)
    cfg, _ = read(out)
    change(cfg)
    write_config(out, cfg)
    with pytest.raises(UserError, match=match) as err:
        Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda c: c.update(mask_token_id=10**6), "mask_token_id=1000000 is not a token id"),
        (lambda c: c.pop("mask_token_id"), "config.json names no mask_token_id"),
        (
            lambda c: c.update(aux_hidden_state_layer_ids=[0, 1, 3]),
            r"aux_hidden_state_layer_ids=\[0, 1, 3\] reach outside 1..3",
        ),
        (
            lambda c: c.update(aux_hidden_state_layer_ids=[3, 1, 2]),
            r"aux_hidden_state_layer_ids=\[3, 1, 2\]: list",
        ),
        (
            lambda c: c.update(draft_vocab_size=c["draft_vocab_size"] - 1),
            "but its tensors hold a draft vocabulary",
        ),
    ],
    ids=["mask-outside", "no-mask", "layers-outside", "layers-unsorted", "draft-vocab"],
)
def test_bad_speculators_dflash_values_are_named_as_the_file_writes_them(tmp_path, tiny_llama, change, match):
    model, tok, _ = tiny_llama
    out = exported(tmp_path, tiny_llama)
    cfg, _ = read(out)
    change(cfg)
    write_config(out, cfg)
    with pytest.raises(UserError, match=match) as err:
        Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert (
        "\n" not in str(err.value)
        and "dflash_config" not in str(err.value)
        and "target_layer_ids" not in str(err.value)
    )


def test_a_speculators_eagle3_draft_vocab_size_must_match_its_tensors(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    out = export_drafter(eagle(model, fp, 3, feature_layers=[1, 2, 3]), "speculators", tmp_path / "e3")
    cfg, _ = read(out)
    write_config(out, {**cfg, "draft_vocab_size": 1000})
    with pytest.raises(
        UserError, match=r"draft_vocab_size=1000, but its tensors hold a draft vocabulary of 300"
    ):
        Drafter.from_pretrained(out, target=model, tokenizer=tok)


def test_the_verifier_refusal_names_an_override_that_loads_it(tmp_path, tiny_llama, monkeypatch, capsys):
    from draftheads.conf.cli import main
    from tests.test_bad_input import one_line_error

    monkeypatch.chdir(tmp_path)
    exported(tmp_path, tiny_llama)
    assert main(["info", "heads=spec", "target=tiny-mistral"]) == 1
    line = one_line_error(capsys)
    assert line.endswith("load it with its verifier: target=tiny-llama"), line
    assert main(["info", "heads=spec", "target=tiny-llama"]) == 0


def test_a_hub_name_and_its_local_copy_are_one_verifier(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    out = exported(tmp_path, tiny_llama)
    cfg, _ = read(out)
    cfg["speculators_config"]["verifier"]["name_or_path"] = f"/models/{fp.name}/"
    write_config(out, cfg)
    assert Drafter.from_pretrained(out, target=model, tokenizer=tok).block_size == BLOCK


# ---- oracle: speculators' own classes ---------------------------------------------------------
def speculators_model(out):
    """speculators' model class built from our config.json, our weights loaded into it, and the
    keys it left missing (its verifier-owned ones, which we must not write)."""
    pytest.importorskip(
        "speculators", reason="speculators is not installed (see the interop extra in pyproject.toml)"
    )
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "eager"
    model = SpeculatorModel.registered_model_class_from_config(config)(config)
    result = model.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= set(model._keys_to_ignore_on_load_missing)
    return config, model.eval()


def share_target(spec, model) -> None:
    """What speculators' ``load_verifier_weights`` does: the verifier's embedding and lm_head (its
    draft-vocabulary rows when the file holds none)."""
    spec.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight)
    head = model.get_output_embeddings().weight
    if not spec.use_draft_vocab:
        spec.lm_head.weight.data.copy_(head)
    elif spec.lm_head.weight.isnan().any():  # not in a file: the verifier's rows of the draft vocabulary
        spec.lm_head.weight.data.copy_(head[spec.t2d])


@torch.no_grad()
def their_block_logits(spec, config, model, context: int = 9) -> torch.Tensor:
    """speculators' DFlash layers on :func:`block_logits`' setup: 9 context positions, then a
    block (the last context token and masks) at positions 9..12."""
    ids = torch.arange(3, 3 + context)[None] * 7 % 200
    hidden = model(ids, output_hidden_states=True).hidden_states
    ctx = spec.hidden_norm(spec.fc(torch.cat([hidden[i] for i in config.aux_hidden_state_layer_ids], -1)))
    x = spec.embed_tokens(torch.tensor([[int(ids[0, -1])] + [config.mask_token_id] * (BLOCK - 1)]))
    cos_sin = spec.rotary_emb(x, torch.arange(context + BLOCK)[None])
    for layer in spec.layers:
        x = layer(hidden_states=x, target_hidden=ctx, attention_mask=None, position_embeddings=cos_sin)
    return spec.lm_head(spec.norm(x))


@torch.no_grad()
def their_eagle3_logits(spec, config, model, length: int = 7) -> torch.Tensor:
    """speculators' EAGLE-3 first layer on :func:`eagle3_logits`' setup (causal, positions 0..)."""
    ids = torch.arange(5, 5 + length)[None] * 11 % 250
    hidden = model(ids, output_hidden_states=True).hidden_states
    g = spec.fc(torch.cat([hidden[i] for i in config.eagle_aux_hidden_state_layer_ids], -1))
    x = torch.cat([spec.embed_tokens(ids), g], -1)
    positions = torch.arange(length)[None]
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    out = spec.layers[0](
        x, attention_mask=causal, position_ids=positions, position_embeddings=spec.rotary_emb(x, positions)
    )
    return spec.lm_head(spec.norm(out))


def test_speculators_runs_our_dflash_export_with_equal_block_logits(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    d = dflash(model, fp, 50)
    config, spec = speculators_model(export_drafter(d, "speculators", tmp_path / "df"))
    assert type(config).__name__ == "DFlashSpeculatorConfig" and config.block_size == BLOCK
    share_target(spec, model)
    assert torch.allclose(their_block_logits(spec, config, model), block_logits(d, model), atol=1e-5)


def test_speculators_runs_our_eagle3_export_with_equal_logits(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    d = eagle(model, fp, 3, feature_layers=[1, 2, 3]).eval()
    config, spec = speculators_model(export_drafter(d, "speculators", tmp_path / "e3"))
    assert type(config).__name__ == "Eagle3SpeculatorConfig" and config.draft_vocab_size == 300
    share_target(spec, model)
    assert torch.allclose(their_eagle3_logits(spec, config, model), eagle3_logits(d, model), atol=1e-5)
    mapped = torch.arange(300) + spec.d2t
    assert torch.equal(mapped, torch.arange(0, 3000, 10)) and int(spec.t2d.sum()) == 300


def saved_by_speculators(out, kind: str, model, fp):
    """A random-weight speculator of ``kind`` for ``model``, built and saved by speculators itself."""
    pytest.importorskip(
        "speculators", reason="speculators is not installed (see the interop extra in pyproject.toml)"
    )
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashSpeculatorConfig
    from speculators.models.dflash.core import DFlashDraftModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig, Qwen3Config

    section = SpeculatorsConfig(
        algorithm=kind,
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
        default_proposal_method="greedy",
        verifier=VerifierConfig(name_or_path=fp.name, architectures=[fp.architecture]),
    )
    tc = model.config.to_dict()
    if kind == "eagle3":
        layers = LlamaConfig(**{**tc, "num_hidden_layers": 1})
        layers._attn_implementation = "eager"
        config = Eagle3SpeculatorConfig(
            transformer_layer_config=layers,
            draft_vocab_size=300,
            eagle_aux_hidden_state_layer_ids=[1, 2, 3],
            speculators_config=section,
        )
        spec = Eagle3DraftModel(config)
        ids = torch.arange(0, 3000, 10)
        t2d = torch.zeros(fp.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        spec.load_vocab_mappings(t2d, ids - torch.arange(300))
    else:
        keys = (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
        )
        layers = Qwen3Config(**{k: tc[k] for k in keys}, num_hidden_layers=2, head_dim=tc["head_dim"])
        layers._attn_implementation = "eager"
        config = DFlashSpeculatorConfig(
            transformer_layer_config=layers,
            draft_vocab_size=fp.vocab_size,
            block_size=BLOCK,
            aux_hidden_state_layer_ids=LAYERS,
            mask_token_id=MASK,
            speculators_config=section,
        )
        spec = DFlashDraftModel(config)
    share_target(spec, model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in spec.named_parameters():
            if (
                not name.startswith(("embed_tokens", "verifier_", "lm_head"))
                or kind == "eagle3"
                and name == "lm_head.weight"
            ):
                p.copy_(p + torch.randn(p.shape, generator=g) * 0.05)
    spec.eval().save_pretrained(str(out))
    return config, spec


def test_an_eagle3_saved_by_speculators_imports_with_equal_logits(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    config, spec = saved_by_speculators(tmp_path / "e3", "eagle3", model, fp)
    ours = Drafter.from_pretrained(tmp_path / "e3", target=model, tokenizer=tok).eval()
    assert ours.feature_layers() == [1, 2, 3] and ours.draft_vocab_size == 300
    assert torch.allclose(eagle3_logits(ours, model), their_eagle3_logits(spec, config, model), atol=1e-5)


def test_a_dflash_saved_by_speculators_imports_with_equal_block_logits(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    config, spec = saved_by_speculators(tmp_path / "df", "dflash", model, fp)
    ours = Drafter.from_pretrained(tmp_path / "df", target=model, tokenizer=tok).eval()
    assert ours.feature_layers() == LAYERS and ours.block_size == BLOCK and ours.num_decoder_layers == 2
    assert torch.allclose(block_logits(ours, model), their_block_logits(spec, config, model), atol=1e-5)


@pytest.mark.parametrize("draft_vocab", [None, 50])
def test_the_model_card_shows_a_speculators_export_that_parses_with_its_target(tiny_llama, draft_vocab):
    from draftheads.conf.cli import parse
    from draftheads.conf.commands.args import ExportArgs
    from draftheads.heads.card import model_card

    model, _, fp = tiny_llama
    text = str(model_card(dflash(model, fp, draft_vocab).config_dict(), repo_id="org/df"))
    exports = [line for line in text.splitlines() if line.startswith("draftheads export")]
    assert any("format=speculators out_dir=./df-speculators" in line for line in exports)
    assert "vllm serve ./df-speculators\n" in text
    for line in exports:  # a reduced vocabulary writes the target's lm_head rows: the target is named
        assert ("target.name_or_path=tiny-llama" in line) == (draft_vocab is not None)
        inv = parse(line.split()[1:])
        assert isinstance(inv.args, ExportArgs) and inv.args.format in ("vllm", "sglang", "speculators")
        if draft_vocab:
            assert inv.args.target.name_or_path == "tiny-llama"


# ---- the verifier a user serves with -----------------------------------------------------------
def saved_target(folder, model, tok):
    """A local copy of ``model`` as a user serves it: save_pretrained's weights and tokenizer."""
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_verifier_folder_is_recorded_and_the_export_imports_back(tmp_path, tiny_llama, capsys):
    model, tok, fp = tiny_llama
    src = tmp_path / "src"
    dflash(model, fp, 50).save_pretrained(src)
    verifier = saved_target(tmp_path / "models" / "tiny-llama", model, tok)
    cfg = cli(src, tmp_path / "out")
    cfg.verifier = str(verifier)
    out = export(cfg)
    printed = capsys.readouterr().out.splitlines()
    assert f"  vllm serve {out}" in printed and not any("verifier=PATH" in line for line in printed)
    written, _ = read(out)
    assert written["speculators_config"]["verifier"]["name_or_path"] == str(verifier.resolve())
    assert Drafter.from_pretrained(out, target=model, tokenizer=tok).block_size == BLOCK


def test_without_a_verifier_the_export_says_how_to_serve_a_local_copy(tmp_path, tiny_llama, capsys):
    model, _, fp = tiny_llama
    src = tmp_path / "src"
    dflash(model, fp).save_pretrained(src)
    out = export(cli(src, tmp_path / "out"))
    printed = capsys.readouterr().out.splitlines()
    at = printed.index(f"  vllm serve {out}")
    assert "verifier=PATH" in printed[at + 1]
    # tiny-llama's head size is 16: said now, not when vLLM's CPU build refuses it
    assert printed[-1] == (
        "note: the attention head size is 16; vLLM's CPU build needs at least 32, so serve this export "
        "with vLLM on a GPU"
    )


def old_layout(folder, model, tok):
    """The target saved without its input embedding (only lm_head.weight, as a tied model's
    older conversion was), which vLLM loads with an uninitialised embedding."""
    from safetensors.torch import save_file

    saved_target(folder, model, tok)
    sd = {k: v for k, v in model.state_dict().items() if k != "model.embed_tokens.weight"}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p, tok: p / "missing", "does not exist"),
        (
            lambda p, tok: saved_target(p / "m", get_target("mistral")[0], tok),
            "it is another model: model_type",
        ),
        (lambda p, tok: saved_target(p / "s", reseeded(), tok), "embedding weights are not the target's"),
        (lambda p, tok: old_layout(p / "o", get_target("llama")[0], tok), "no input embedding"),
    ],
)
def test_a_verifier_that_is_missing_or_not_the_target_is_refused_before_writing(
    tmp_path, tiny_llama, make, match
):
    model, tok, fp = tiny_llama
    src = tmp_path / "src"
    dflash(model, fp).save_pretrained(src)
    cfg = cli(src, tmp_path / "out")
    cfg.verifier = str(make(tmp_path, tok))
    with pytest.raises(UserError, match=match) as err:
        export(cfg)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def get_target(kind: str):
    from tests.conftest import get_target as loaded

    return loaded(kind)


def reseeded():
    """The tiny Llama's shape with other weights."""
    from draftheads.heads.target.load import build_tiny

    return build_tiny("llama", get_target("llama")[1], seed=1234)
