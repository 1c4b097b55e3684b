"""Export to vLLM and SGLang: every (drafter, engine) pair passes the engine spec table, renames
exactly, round-trips through the importer, and every unsupported case is one clear line."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import TargetConfig
from draftheads.heads import Drafter, EagleDrafter, MedusaHeads
from draftheads.heads.engine.loaders import RULES, rules_for
from draftheads.heads.export import FORMATS, export, export_drafter, validate_export


def randomize(d: Drafter, seed: int = 0) -> Drafter:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return d


def eagle(model, fp, version: int, **kw) -> EagleDrafter:
    extra = {"draft_vocab_size": 300} if version == 3 else {}
    d = EagleDrafter(fp, target_config=model.config.to_dict(), version=version, **extra, **kw)
    randomize(d)
    if version == 3:
        d.set_vocab(torch.arange(0, 3000, 10))
    return d.attach(model)


def config_for(heads, engine: str, out) -> Config:
    cfg = Config(heads=str(heads), format=engine, out=str(out))
    cfg.target = TargetConfig(name_or_path="tiny-llama", tiny="llama")
    return cfg


def read(out) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_eagle3_export_renames_and_round_trips(tmp_path, tiny_llama, engine):
    model, tok, fp = tiny_llama
    d = eagle(model, fp, 3, feature_layers=[1, 2, 3])
    out = export_drafter(d, engine, tmp_path / engine)
    cfg, sd = read(out)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 300
    assert cfg["num_hidden_layers"] == 1 and cfg["target_hidden_size"] == 64
    if engine == "vllm":  # vLLM: layer inputs, as ours; SGLang: layer outputs (it captures id + 1)
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and "eagle_config" not in cfg
    else:
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    own = d.state_dict()
    assert torch.equal(sd["midlayer.hidden_norm.weight"], own["hidden_norm.weight"])
    assert torch.equal(sd["midlayer.self_attn.q_proj.weight"], own["layers.0.self_attn.q_proj.weight"])
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (64, 128)  # q/k/v read concat(emb, feature)
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(300) + sd["d2t"], torch.arange(0, 3000, 10))
    # The export is itself an official EAGLE-3 layout: importing it gives the same drafter back.
    back = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert back.feature_layers() == [1, 2, 3]
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in own.items())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_eagle1_export(tmp_path, tiny_llama, engine):
    model, tok, fp = tiny_llama
    # vLLM's fc has no bias: a drafter meant for it is built (and trained) with draft.eagle.fc_bias=false.
    d = eagle(model, fp, 1, num_decoder_layers=2, fc_bias=engine == "sglang")
    assert ("fc.bias" in d.state_dict()) == (engine == "sglang")
    out = export_drafter(d, engine, tmp_path / engine)
    cfg, sd = read(out)
    assert cfg["architectures"] == (["LlamaForCausalLM"] if engine == "vllm" else ["LlamaForCausalLMEagle"])
    assert sd["fc.weight"].shape == (64, 128) and ("fc.bias" in sd) == (engine == "sglang")
    assert "layers.0.input_layernorm.weight" not in sd and "layers.1.input_layernorm.weight" in sd
    back = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    assert back.fc_bias == (engine == "sglang")
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())


def test_sglang_export_of_a_bias_free_eagle1_writes_an_exact_zero_bias(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    out = export_drafter(eagle(model, fp, 1, fc_bias=False), "sglang", tmp_path / "x")
    _, sd = read(out)
    assert torch.equal(sd["fc.bias"], torch.zeros(64))


def test_fc_bias_false_is_recorded_and_trains_without_a_bias(tmp_path, tiny_llama):
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.train.drafters import build_drafter

    model, tok, _ = tiny_llama
    d = build_drafter(Config(draft=DraftConfig.of(kind="eagle", version=1, fc_bias=False)), model, tok)
    assert d.fc.bias is None and "fc.bias" not in d.state_dict()
    d.save_pretrained(tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["spec"]["fc_bias"] is False
    assert Drafter.from_pretrained(tmp_path / "d").fc.bias is None


def test_vllm_refuses_a_nonzero_eagle_fc_bias(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    with pytest.raises(UserError, match="silently drops fc.bias.*format=sglang.*draft.eagle.fc_bias=false"):
        export_drafter(eagle(model, fp, 1), "vllm", tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("lm_head", ["shared", "copy"])
def test_medusa_vllm_export_through_the_cli_entry(tmp_path, tiny_llama, lm_head, capsys):
    model, tok, fp = tiny_llama
    d = randomize(MedusaHeads(fp, num_heads=3, num_layers=2, lm_head=lm_head)).attach(model)
    d.save_pretrained(tmp_path / "heads")
    out = export(config_for(tmp_path / "heads", "vllm", tmp_path / "vllm"))
    assert "vllm serve tiny-llama --speculative-config" in capsys.readouterr().out
    cfg, sd = read(out)
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert (cfg["num_heads"], cfg["num_hidden_layers"], cfg["medusa_fc_bias"]) == (3, 2, True)
    # vLLM's convention for a shared lm_head: original_lm_head and one matrix, not a copy per head.
    assert cfg["original_lm_head"] == (lm_head == "shared")
    heads_written = sorted(k for k in sd if k.startswith("lm_heads."))
    assert heads_written == (
        ["lm_heads.0.weight"] if lm_head == "shared" else [f"lm_heads.{i}.weight" for i in range(3)]
    )
    # vLLM's ResidualBlock: x + SiLU(layer(x)) per layer, then lm_heads[i]; same logits as ours.
    h = torch.randn(1, 4, 64)
    ours = d(h)
    for i in range(3):
        x = h
        for j in range(2):
            x = x + F.silu(
                F.linear(x, sd[f"blocks.{i}.layers.{j}.weight"], sd[f"blocks.{i}.layers.{j}.bias"])
            )
        lm = sd["lm_heads.0.weight" if cfg["original_lm_head"] else f"lm_heads.{i}.weight"]
        torch.testing.assert_close(F.linear(x, lm), ours[i])
    if lm_head == "shared":
        assert torch.equal(sd["lm_heads.0.weight"], model.lm_head.weight)


@pytest.mark.parametrize("num_heads", [2, 4])
def test_medusa_serve_command_uses_the_head_count(tmp_path, tiny_llama, num_heads, capsys):
    """vLLM copies num_speculative_tokens into its head count: it must be the drafter's own."""
    from draftheads.heads.hub import model_card

    model, _, fp = tiny_llama
    d = MedusaHeads(fp, num_heads=num_heads, lm_head="copy")
    d.save_pretrained(tmp_path / "heads")
    export(config_for(tmp_path / "heads", "vllm", tmp_path / "vllm"))
    printed = capsys.readouterr().out
    assert f'"num_speculative_tokens": {num_heads}' in printed
    from draftheads.train.card import model_card as training_card

    for card in (str(model_card(d.config_dict(), "org/medusa")), training_card(d, {}, {"val/tau": 1.2})):
        assert f'"num_speculative_tokens": {num_heads}' in card and '"num_speculative_tokens": 3' not in card


def test_exporting_an_official_checkpoint_imports_it_first(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    src = tmp_path / "official"
    src.mkdir()
    sd = {"0.0.linear.weight": torch.randn(64, 64), "0.0.linear.bias": torch.randn(64)}
    save_file(sd, str(src / "medusa_lm_head.safetensors"))
    out = export(config_for(src, "vllm", tmp_path / "vllm"))
    _, got = read(out)
    assert torch.equal(got["blocks.0.layers.0.weight"], sd["0.0.linear.weight"])
    assert torch.equal(got["lm_heads.0.weight"], model.lm_head.weight)


@pytest.mark.parametrize(
    "case,match",
    [
        ("sglang-medusa", "SGLang has no Medusa support"),
        ("bad-format", "format=trt is not supported"),
        ("eagle3-final-layer", "cannot be served"),
        ("eagle3-two-layers", "have one layer"),
        ("shared-unattached", "load the target to export them"),
        ("missing-args", "needs heads=DIR format=vllm|sglang out=DIR"),
    ],
)
def test_export_refusals_are_one_line(tmp_path, tiny_llama, case, match):
    model, _, fp = tiny_llama
    with pytest.raises(UserError, match=match) as e:
        if case == "sglang-medusa":
            export_drafter(MedusaHeads(fp, num_heads=2).attach(model), "sglang", tmp_path)
        elif case == "bad-format":
            export_drafter(eagle(model, fp, 3), "trt", tmp_path)
        elif case == "eagle3-final-layer":
            export_drafter(eagle(model, fp, 3, feature_layers=[1, 2, 4]), "vllm", tmp_path)
        elif case == "eagle3-two-layers":
            export_drafter(eagle(model, fp, 3, num_decoder_layers=2), "sglang", tmp_path)
        elif case == "shared-unattached":
            export_drafter(MedusaHeads(fp, num_heads=2), "vllm", tmp_path)
        else:
            export(Config(heads=str(tmp_path), format="vllm"))
    assert "\n" not in str(e.value)


def test_validator_rejects_what_the_engine_would_misload(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    out = export_drafter(eagle(model, fp, 3), "sglang", tmp_path / "x")
    cfg, sd = read(out)

    def check(cfg, sd, match):
        d = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        save_file(sd, str(d / "model.safetensors"))
        with pytest.raises(UserError, match=match):
            validate_export(d, "sglang")

    check(cfg, {k: v for k, v in sd.items() if k != "d2t"}, "missing d2t")
    check(cfg, {**sd, "fc.bias": torch.zeros(64)}, r"unexpected fc.bias \(the engine would skip it\)")
    check(cfg, {**sd, "norm.weight": torch.ones(65)}, r"norm.weight has shape \(65,\)")
    check(cfg, {**sd, "d2t": sd["d2t"].int()}, "d2t has dtype torch.int32")
    check({k: v for k, v in cfg.items() if k != "draft_vocab_size"}, sd, "lacks draft_vocab_size")
    check({**cfg, "architectures": ["LlamaForCausalLM"]}, sd, "not a sglang drafter format")
    with pytest.raises(UserError, match="must not set eagle_config for vllm"):
        validate_export(out, "vllm")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(
    "ids,match",
    [
        ([3, 1, 2], "ascending order"),
        ([1, 1, 2], "listed twice"),
        ([0, 1, 2], "layer 0"),
        ([1, 2], "reads 3 target layer"),
    ],
)
def test_validator_refuses_aux_layers_the_engines_misread(tmp_path, tiny_llama, engine, ids, match):
    """Both engines capture each aux layer once, ascending, from layer 1: the export must say so."""
    model, _, fp = tiny_llama
    out = export_drafter(eagle(model, fp, 3, feature_layers=[1, 2, 3]), engine, tmp_path / "x")
    cfg, _ = read(out)
    if engine == "vllm":
        cfg["eagle_aux_hidden_state_layer_ids"] = ids
    else:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in ids]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=f"{match}.*llama.py") as e:
        validate_export(out, engine, fp.num_layers)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_export_refuses_a_drafter_with_unservable_feature_layers(tmp_path, tiny_llama, engine):
    model, _, fp = tiny_llama
    d = eagle(model, fp, 3, feature_layers=[1, 2, 3])
    d._feature_layers = [3, 1, 2]  # as if built before feature layers were validated
    with pytest.raises(UserError, match="ascending"):
        export_drafter(d, engine, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_export_refuses_to_write_over_a_checkpoint(tmp_path, tiny_llama):
    """out= the drafter's own directory (or any checkpoint) is refused and nothing changes."""
    model, _, fp = tiny_llama
    d = eagle(model, fp, 3, feature_layers=[1, 2, 3])
    d.save_pretrained(tmp_path / "heads")
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path / "other")
    before = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in tmp_path.rglob("*") if f.is_file()}
    for out, match in [("heads", "drafter's own directory"), ("other", "already holds a drafter")]:
        with pytest.raises(UserError, match=match) as e:
            export(config_for(tmp_path / "heads", "vllm", tmp_path / out))
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="drafter's own directory"):
        export_drafter(Drafter.from_pretrained(tmp_path / "heads"), "vllm", tmp_path / "heads")
    after = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in tmp_path.rglob("*") if f.is_file()}
    assert after == before
    # a previous export may be rewritten
    export(config_for(tmp_path / "heads", "vllm", tmp_path / "exp"))
    export(config_for(tmp_path / "heads", "vllm", tmp_path / "exp"))


def test_eagle3_named_layers_0_is_detected_as_eagle3(tmp_path, tiny_llama):
    """vLLM also loads EAGLE-3 weights named layers.0.*: they are EAGLE-3 by fc over 3H, d2t, hidden_norm."""
    model, tok, fp = tiny_llama
    d = eagle(model, fp, 3, feature_layers=[1, 2, 3])
    out = export_drafter(d, "vllm", tmp_path / "x")
    cfg, sd = read(out)
    renamed = {k.replace("midlayer.", "layers.0.", 1): v for k, v in sd.items()}
    src = tmp_path / "renamed"
    src.mkdir()
    save_file(renamed, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps(cfg))
    back = Drafter.from_pretrained(src, target=model, tokenizer=tok)
    assert back.version == 3 and back.provenance["imported_from"]["layout"] == "eagle-3"
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())


def test_every_engine_rule_names_its_engine_source():
    for rule in RULES:
        assert rule.sources and all(s.endswith(".py") for s in rule.sources)
        assert all(m in {(e, f.method) for (e, _), f in FORMATS.items()} for m in rule.methods)
    assert rules_for("vllm", "eagle3") and rules_for("sglang", "EAGLE3") and rules_for("vllm", "medusa")


def test_spec_table_covers_every_engine_method():
    assert set(FORMATS) == {
        ("vllm", "eagle"),
        ("sglang", "eagle"),
        ("vllm", "eagle3"),
        ("sglang", "eagle3"),
        ("vllm", "medusa"),
        ("vllm", "dflash"),
        ("sglang", "dflash"),
    }


@pytest.mark.parametrize("where", ["a-file", "/proc/draftheads-export"])
def test_export_refuses_an_unusable_out_before_loading_anything(tmp_path, tiny_llama, where):
    model, _, fp = tiny_llama
    MedusaHeads(fp, num_heads=2, lm_head="copy").save_pretrained(tmp_path / "heads")
    out = tmp_path / where if where == "a-file" else where
    if where == "a-file":
        out.write_text("keep me")
    with pytest.raises(UserError, match="existing file|not writable") as e:
        export(config_for(tmp_path / "heads", "vllm", out))
    assert "\n" not in str(e.value)
    if where == "a-file":
        assert out.read_text() == "keep me"


def test_the_training_card_lists_block_positions_in_order(tiny_llama):
    from draftheads.train.card import model_card as training_card

    _, _, fp = tiny_llama
    metrics = {f"eval/pos{k}/acc_top1": 1.0 / k for k in (10, 2, 1, 15)} | {"eval/tau": 1.5}
    card = training_card(MedusaHeads(fp, num_heads=2), {}, metrics)
    rows = [line.split("`")[1] for line in card.splitlines() if line.startswith("| `eval/")]
    assert rows == [
        "eval/pos1/acc_top1",
        "eval/pos2/acc_top1",
        "eval/pos10/acc_top1",
        "eval/pos15/acc_top1",
        "eval/tau",
    ]
