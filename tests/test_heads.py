"""Drafter modules and their checkpoint format: shapes, round trips and strict loading."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.heads import Drafter, EagleDrafter, MedusaHeads, TargetFingerprint
from draftheads.heads.medusa import ResBlock

VARIANTS = [
    ("medusa", dict(num_heads=3, num_layers=2, lm_head="shared")),
    ("medusa", dict(num_heads=2, num_layers=1, lm_head="copy")),
    ("eagle", dict(version=1)),
    ("eagle", dict(version=3, draft_vocab_size=300)),
    ("eagle", dict(version=1, num_decoder_layers=2, save_shared=True)),
]


def build(kind: str, model, fp: TargetFingerprint, **kw) -> Drafter:
    if kind == "medusa":
        return MedusaHeads(fp, **kw).attach(model)
    return EagleDrafter(fp, target_config=model.config.to_dict(), **kw).attach(model)


def randomize(d: Drafter) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in d.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.02)


def test_resblock_starts_as_identity_and_blocks_are_independent(tiny_llama):
    model, _, fp = tiny_llama
    x = torch.randn(2, 3, fp.hidden_size)
    block = ResBlock(fp.hidden_size)
    torch.testing.assert_close(block(x), x + torch.nn.functional.silu(block.linear.bias))
    heads = MedusaHeads(fp, num_heads=2, num_layers=3)
    weights = [blk.linear.weight for head in heads.blocks for blk in head]
    assert len({w.data_ptr() for w in weights}) == 6  # six distinct ResBlocks, no sharing


def test_medusa_v2_shares_the_frozen_lm_head_and_v1_copies_it(tiny_llama):
    model, _, fp = tiny_llama
    v2 = MedusaHeads(fp, num_heads=2, lm_head="shared").attach(model)
    assert all(p.data_ptr() != model.lm_head.weight.data_ptr() for p in v2.parameters())
    assert "lm_head" not in "".join(v2.state_dict())
    h = torch.randn(1, 4, fp.hidden_size)
    torch.testing.assert_close(v2(h)[0], model.lm_head(v2.head_hidden(h)[0]))
    v1 = MedusaHeads(fp, num_heads=2, lm_head="copy").attach(model)
    v1.init_lm_heads_from_target()
    assert torch.equal(v1.lm_heads[1].weight, model.lm_head.weight)
    assert v1.lm_heads[1].weight.requires_grad and not model.lm_head.weight.requires_grad


@pytest.mark.parametrize("kind,kw", VARIANTS)
def test_save_load_round_trip(tmp_path, tiny_llama, kind, kw):
    model, tok, fp = tiny_llama
    d = build(kind, model, fp, **kw)
    randomize(d)
    d.provenance = {"steps": 7}
    d.save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert (
        conf["kind"] == kind
        and conf["target"]["hidden_size"] == fp.hidden_size
        and conf["provenance"] == {"steps": 7}
    )
    back = Drafter.from_pretrained(tmp_path, target=model, tokenizer=tok)
    assert type(back) is type(d) and back.spec() == d.spec()
    sd, sb = d.state_to_save(), back.state_dict()
    assert sd.keys() == sb.keys() and all(torch.equal(sd[k], sb[k]) for k in sd)
    # The shared target modules are never written, unless asked (save_shared).
    assert ("embed_tokens.weight" in sb) == bool(kw.get("save_shared"))
    assert not any(
        k.startswith(("model.", "lm_head.weight")) for k in sb if kind == "eagle" and kw.get("version") == 1
    )


def test_drafter_forward_on_every_tiny_architecture(tiny):
    kind, model, tok, fp = tiny
    ids = torch.randint(0, fp.vocab_size, (2, 6))
    out = model(ids, output_hidden_states=True)
    medusa = MedusaHeads(fp, num_heads=3).attach(model)
    assert medusa(medusa.select_features(out.hidden_states)).shape == (3, 2, 6, fp.vocab_size)
    versions = [1] if kind == "gpt2" else [1, 3]
    for v in versions:
        eagle = EagleDrafter(
            fp, target_config=model.config.to_dict(), version=v, draft_vocab_size=500
        ).attach(model)
        feats = eagle.select_features(out.hidden_states)
        assert feats.shape[-1] == fp.hidden_size * (3 if v == 3 else 1)
        h = eagle(ids, eagle.fuse(feats), torch.arange(6).expand(2, 6))
        assert h.shape == (2, 6, fp.hidden_size)
        assert eagle.logits(h).shape == (2, 6, 500 if v == 3 else fp.vocab_size)


def test_eagle_layers_are_llama_layers_whatever_the_target(tiny):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    kind, model, tok, fp = tiny
    eagle = EagleDrafter(fp, target_config=model.config.to_dict(), version=1)
    assert all(type(layer) is LlamaDecoderLayer for layer in eagle.layers)
    assert eagle.layer_config.hidden_size == fp.hidden_size and eagle.layer_config.hidden_act == "silu"


def test_eagle3_vocab_maps(tiny_llama):
    model, _, fp = tiny_llama
    e = EagleDrafter(fp, target_config=model.config.to_dict(), version=3, draft_vocab_size=4)
    ids = torch.tensor([7, 3, 100, 42])
    e.set_vocab(ids)
    assert e.draft_to_target(torch.arange(4)).tolist() == [3, 7, 42, 100]
    assert e.t2d.sum() == 4 and e.t2d[[3, 7, 42, 100]].all()


def test_fingerprint_mismatch_names_both_targets(tmp_path, tiny_llama):
    from tests.conftest import get_target

    model, tok, fp = tiny_llama
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path)
    gpt2, gtok = get_target("gpt2")
    other = TargetFingerprint(**{**fp.to_dict(), "tokenizer_hash": "0" * 64, "name": "other"})
    gpt2.config._name_or_path = "tiny-gpt2"
    with pytest.raises(UserError, match=r"tiny-llama.*tiny-gpt2.*num_layers") as e:
        # same hidden/vocab, different depth (GPT-2 tiny has 4 layers too, so change the record)
        conf = json.loads((tmp_path / "config.json").read_text())
        conf["target"]["num_layers"] = 30
        (tmp_path / "config.json").write_text(json.dumps(conf))
        Drafter.from_pretrained(tmp_path, target=gpt2, tokenizer=gtok)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="tokenizer_hash"):
        other.check_compatible(fp)


def test_strict_load_rejects_wrong_and_damaged_checkpoints(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path / "ok")
    # config says 3 heads but the weights hold 2
    bad = tmp_path / "ok"
    conf = json.loads((bad / "config.json").read_text())
    conf["spec"]["num_heads"] = 3
    (bad / "config.json").write_text(json.dumps(conf))
    with pytest.raises(UserError, match="missing"):
        Drafter.from_pretrained(bad)
    # a truncated weights file
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path / "trunc")
    w = tmp_path / "trunc" / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(UserError, match="truncated or corrupt"):
        Drafter.from_pretrained(tmp_path / "trunc")
    # a corrupt config.json
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path / "cfg")
    (tmp_path / "cfg" / "config.json").write_text('{"kind": "medusa", ')
    with pytest.raises(UserError, match="not valid JSON"):
        Drafter.from_pretrained(tmp_path / "cfg")
    # the wrong kind of checkpoint
    with pytest.raises(UserError, match="holds a medusa drafter"):
        EagleDrafter.from_pretrained(tmp_path / "trunc" if False else _fresh(tmp_path, fp))
    # no checkpoint at all
    with pytest.raises(UserError, match="no config.json"):
        Drafter.from_pretrained(tmp_path)


def _fresh(tmp_path, fp):
    d = tmp_path / "fresh"
    MedusaHeads(fp, num_heads=1).save_pretrained(d)
    return d


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    MedusaHeads(fp, num_heads=1).save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize(
    "draft",
    [
        dict(kind="medusa"),
        dict(kind="eagle", version=1),
        dict(kind="eagle", version=3, draft_vocab_size=300),
        dict(kind="eagle", version=3, feature_layers=[1, 2, 4], draft_vocab_size=300),
    ],
)
def test_config_and_drafter_agree_on_training_layers(tiny_llama, draft):
    """The feature cache is built from the config, training reads from the drafter: one answer."""
    from draftheads.conf.schema import Config
    from draftheads.conf.schema.heads import DraftConfig
    from draftheads.train.drafters import build_drafter

    model, tok, fp = tiny_llama
    cfg = Config(draft=DraftConfig.of(**draft))
    drafter = build_drafter(cfg, model, tok)
    L = fp.num_layers
    assert drafter.training_layers() == cfg.draft.training_layers(L)
    from draftheads.conf.schema.kinds.eagle import default_eagle3_layers

    expected = {"medusa": [L], 1: [L, L], 3: draft.get("feature_layers", default_eagle3_layers(L)) + [L]}
    assert (
        cfg.draft.training_layers(L) == expected["medusa" if draft["kind"] == "medusa" else draft["version"]]
    )


# ---- EAGLE-3 feature layers and nonsensical drafter configs ---------------------------------------
def test_default_eagle3_layers_are_distinct_ascending_and_servable():
    from draftheads.conf.schema.kinds.eagle import default_eagle3_layers

    for L in range(4, 257):
        layers = default_eagle3_layers(L)
        assert len(set(layers)) == 3 and layers == sorted(layers) and 1 <= layers[0] and layers[-1] <= L - 1
    assert default_eagle3_layers(32) == [2, 16, 29]  # EAGLE-3's own choice where it is distinct
    for L in (1, 2, 3):  # fewer than three servable layers (1..L-1): refused, with the way out
        with pytest.raises(UserError, match="draft.eagle.feature_layers") as e:
            default_eagle3_layers(L)
        assert "\n" not in str(e.value)


def _read_draft(kind: str, **keys):
    """A DraftConfig as the command line reads it: the schema merged with ``keys`` in ``kind``'s
    section, then built."""
    from omegaconf import OmegaConf

    from draftheads.conf.schema.heads import DraftConfig

    overrides = {"kind": kind, kind: keys} if keys else {"kind": kind}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DraftConfig), overrides))


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(feature_layers=[3, 1, 2]), "ascending order"),
        (dict(feature_layers=[1, 1, 2]), "listed twice"),
        (dict(feature_layers=[0, 1, 2]), "layer 0"),
        (dict(feature_layers=[1, 2]), "reads 3 target layer"),
        (dict(draft_vocab_size=0), "draft.eagle.draft_vocab_size=0"),
        (dict(ttt_steps=0), "draft.eagle.ttt_steps=0"),
        (dict(token_loss_weight=-1.0), "draft.eagle.token_loss_weight=-1.0 must not be negative"),
        (dict(kind="medusa", num_heads=0), "draft.medusa.num_heads=0"),
        (dict(kind="medusa", lm_head="tied"), "draft.medusa.lm_head='tied'"),
        (dict(kind="nokind"), "draft.kind='nokind'"),
        (dict(version=2), "draft.eagle.version=2"),
    ],
)
def test_nonsensical_draft_configs_are_refused_when_read(overrides, match):
    with pytest.raises(UserError, match=match) as e:
        overrides = dict(overrides)
        kind = overrides.pop("kind", "eagle")
        _read_draft(kind, **({"version": 3} if kind == "eagle" else {}) | overrides)
    assert "\n" not in str(e.value)


def test_feature_layers_beyond_the_target_are_refused_when_the_drafter_is_built(tiny_llama):
    model, _, fp = tiny_llama
    with pytest.raises(UserError, match=r"4 layers, so ids must be in 1\.\.4"):
        build("eagle", model, fp, version=3, feature_layers=[1, 2, 9], draft_vocab_size=300)


# ---- what loading refuses: another target, NaN weights, disagreeing files -----------------------
def test_a_drafter_for_another_architecture_or_other_weights_is_refused(tmp_path, tiny_llama):
    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads.target.load import load_target
    from tests.conftest import get_target

    model, tok, fp = tiny_llama
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path / "d")
    mistral, mtok = get_target("mistral")  # same sizes and tokenizer as tiny-llama
    with pytest.raises(UserError, match=r"tiny-llama.*tiny-mistral.*mismatch: model_type") as e:
        Drafter.from_pretrained(tmp_path / "d", target=mistral, tokenizer=mtok)
    assert "\n" not in str(e.value)
    reseeded, rtok = load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama", seed=1))
    with pytest.raises(UserError, match=r"mismatch: weights"):
        Drafter.from_pretrained(tmp_path / "d", target=reseeded, tokenizer=rtok)
    # the same weights in bfloat16 are the same target
    bf16, btok = load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama", dtype="bfloat16"))
    Drafter.from_pretrained(tmp_path / "d", target=bf16, tokenizer=btok)


def test_old_checkpoints_without_the_new_fingerprint_fields_still_load(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    for key in ("model_type", "weight_sample"):
        del conf["target"][key]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    loaded = Drafter.from_pretrained(tmp_path, target=model, tokenizer=tok)
    assert loaded.target_fingerprint.model_type == "" and loaded.target_fingerprint.weight_sample == ()


def test_nan_weights_are_refused(tmp_path, tiny_llama):
    from safetensors.torch import load_file, save_file

    model, tok, fp = tiny_llama
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd["blocks.1.0.linear.weight"][3, 5] = float("nan")
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="blocks.1.0.linear.weight holds NaN or infinite values") as e:
        Drafter.from_pretrained(tmp_path, target=model, tokenizer=tok)
    assert "\n" not in str(e.value)


def test_info_refuses_a_checkpoint_whose_config_and_weights_disagree(tmp_path, tiny_llama, capsys):
    from draftheads.conf.schema import Config
    from draftheads.heads.commands import info

    _, _, fp = tiny_llama
    MedusaHeads(fp, num_heads=2).save_pretrained(tmp_path)
    info(Config(heads=str(tmp_path)))
    assert "kind: medusa" in capsys.readouterr().out
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["spec"]["num_heads"] = 3
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(UserError, match="does not match the drafter in config.json") as e:
        info(Config(heads=str(tmp_path)))
    assert "\n" not in str(e.value) and "kind:" not in capsys.readouterr().out


def test_medusa2_checkpoint_loads_its_adapters_and_decodes_like_the_adapted_target(tmp_path, tokenizer):
    """The CLI's load (Drafter.from_pretrained on a fresh target) puts the LoRA adapters on."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.conf.schema.heads import DraftConfig, TargetConfig
    from draftheads.decode import SpeculativeGenerator
    from draftheads.heads.target.fingerprint import fingerprint
    from draftheads.heads.target.load import load_target
    from draftheads.train.adapters import add_lora, save_adapters

    tcfg = TargetConfig(name_or_path="tiny-llama", tiny="llama")
    base, tok = load_target(tcfg)
    fp = fingerprint(base, tok)
    adapted = add_lora(base, DraftConfig.of(lora=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # adapters that change the target's greedy text
    adapted.eval()  # no LoRA dropout
    heads = MedusaHeads(fp, num_heads=3)
    randomize(heads)
    heads.requires_adapters = True
    heads.save_pretrained(tmp_path)
    save_adapters(adapted, tmp_path)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    expected = adapted.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    plain, _ = load_target(tcfg)
    plain_out = plain.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    assert not torch.equal(plain_out, expected)  # the adapters matter

    target, tok2 = load_target(tcfg)
    drafter = Drafter.from_pretrained(tmp_path, target=target, tokenizer=tok2, map_location="cpu")
    assert getattr(target, "peft_config", None)
    out = SpeculativeGenerator(target, drafter, tok2, DecodeConfig()).generate(ids, max_new_tokens=24)
    assert torch.equal(out[:, : expected.shape[1]], expected)


def test_heads_imports_only_itself_and_the_config_schema_without_loops():
    """heads/ is the bottom layer: it imports heads/*, conf.errors, conf.moved and conf.schema.* only, and no
    module of heads/ imports one that imports it back (function-level imports included)."""
    import ast
    from pathlib import Path

    import draftheads.heads

    root = Path(draftheads.heads.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in sorted(root.glob("*.py")):
        name = path.stem
        deps = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftheads"):
                mod = node.module
            elif isinstance(node, ast.Import):
                mod = next((a.name for a in node.names if a.name.startswith("draftheads")), None)
            else:
                continue
            if mod is None:
                continue
            allowed = mod.startswith(("draftheads.heads", "draftheads.conf.schema")) or mod in (
                "draftheads.conf.errors",
                "draftheads.conf.moved",
            )
            assert allowed, f"heads/{path.name} imports {mod}"
            if mod.startswith("draftheads.heads.") and name != "__init__":
                deps.add(mod.split(".")[2])

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            d == goal or (d not in seen and reaches(d, goal, seen | {d})) for d in graph.get(start, ())
        )

    loops = [m for m in graph if reaches(m, m, {m})]
    assert not loops, f"import loops through {loops}"


def test_drafter_is_a_hub_mixin_whose_hooks_keep_the_draftheads_format(tmp_path, tiny_llama):
    from huggingface_hub import PyTorchModelHubMixin

    model, tok, fp = tiny_llama
    d = MedusaHeads(fp, num_heads=2)
    randomize(d)
    assert isinstance(d, PyTorchModelHubMixin)
    d._save_pretrained(tmp_path)  # the mixin's save hook writes config.json + model.safetensors
    assert json.loads((tmp_path / "config.json").read_text())["kind"] == "medusa"
    back = MedusaHeads._from_pretrained(model_id=str(tmp_path), target=model, tokenizer=tok)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())
    card = d.generate_model_card()
    assert "Medusa-1" in str(card) and card.data.library_name == "draftheads"


def test_lora_on_modules_the_target_lacks_is_refused_naming_the_key():
    from draftheads.conf.schema.heads import DraftConfig, TargetConfig
    from draftheads.heads.target.load import load_target
    from draftheads.train.adapters import add_lora

    base, _ = load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama"))
    with pytest.raises(UserError) as e:
        add_lora(base, DraftConfig.of("medusa", lora=True, lora_target_modules=["q_proj", "nope_proj"]))
    assert str(e.value).startswith(
        "draft.medusa.lora_target_modules: the target has no module named ['nope_proj']"
    )
    assert "\n" not in str(e.value)
