"""Importing official Medusa and EAGLE checkpoints: layouts built as documented in
shared/reference (medusa.md §2, eagle.md §2) for the tiny Llama target, loaded through
``Drafter.from_pretrained`` with exact weights, greedy decoding identical to the target's,
and one-line errors for every way an import can go wrong."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from draftheads.conf.errors import UserError
from draftheads.heads import Drafter, EagleDrafter, MedusaHeads
from draftheads.heads.convert.official import detect_layout

H, V, MLP, KV = 64, 49152, 128, 32  # tiny Llama: hidden, vocab, MLP width, k/v projection rows


def rnd(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return (torch.randn(*shape, generator=g) * 0.05).to(dtype)


def write(directory: Path, config: dict | None, tensors: dict[str, torch.Tensor], filename: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    if filename.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / filename))
    else:
        torch.save(tensors, directory / filename)
    return directory


def medusa_v1_tensors(heads: int, layers: int, with_lm_head: bool, dtype=torch.bfloat16) -> dict:
    """``{h}.{l}.linear.weight|bias`` and (v1) ``{h}.{L}.weight``, bf16 like the released files."""
    sd = {}
    for h in range(heads):
        for j in range(layers):
            sd[f"{h}.{j}.linear.weight"] = rnd(H, H, dtype=dtype, seed=10 * h + j)
            sd[f"{h}.{j}.linear.bias"] = rnd(H, dtype=dtype, seed=10 * h + j + 5)
        if with_lm_head:
            sd[f"{h}.{layers}.weight"] = rnd(V, H, dtype=dtype, seed=h + 99)
    return sd


def llama_layer(prefix: str, qkv_in: int, input_norm: bool, seed: int) -> dict:
    sd = {
        f"{prefix}self_attn.q_proj.weight": rnd(H, qkv_in, seed=seed),
        f"{prefix}self_attn.k_proj.weight": rnd(KV, qkv_in, seed=seed + 1),
        f"{prefix}self_attn.v_proj.weight": rnd(KV, qkv_in, seed=seed + 2),
        f"{prefix}self_attn.o_proj.weight": rnd(H, H, seed=seed + 3),
        f"{prefix}mlp.gate_proj.weight": rnd(MLP, H, seed=seed + 4),
        f"{prefix}mlp.up_proj.weight": rnd(MLP, H, seed=seed + 5),
        f"{prefix}mlp.down_proj.weight": rnd(H, MLP, seed=seed + 6),
        f"{prefix}post_attention_layernorm.weight": 1 + rnd(H, seed=seed + 7),
    }
    if input_norm:
        sd[f"{prefix}input_layernorm.weight"] = 1 + rnd(H, seed=seed + 8)
    return sd


def llama_config(**kw) -> dict:
    base = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=H,
        intermediate_size=MLP,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=V,
        rms_norm_eps=1e-6,
        max_position_embeddings=1024,
    )
    return {**base, **kw}


def eagle1_tensors(model, layers: int = 1) -> dict:
    sd = {
        "embed_tokens.weight": model.get_input_embeddings().weight.detach().clone(),
        "fc.weight": rnd(H, 2 * H, seed=1),
        "fc.bias": rnd(H, seed=2),
    }
    for i in range(layers):  # official EAGLE-1: layer 0 has no input_layernorm
        sd.update(llama_layer(f"layers.{i}.", H, input_norm=i > 0, seed=20 * i))
    return sd


def eagle3_tensors(draft_vocab: int = 300) -> dict:
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:draft_vocab].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    sd = llama_layer("midlayer.", 2 * H, input_norm=True, seed=40)
    sd.update(
        {
            "midlayer.hidden_norm.weight": 1 + rnd(H, seed=50),
            "fc.weight": rnd(H, 3 * H, seed=51),
            "norm.weight": 1 + rnd(H, seed=52),
            "lm_head.weight": rnd(draft_vocab, H, seed=53),
            "d2t": ids - torch.arange(draft_vocab),
            "t2d": t2d,
        }
    )
    return {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}  # fp16, as released


def tuned_backbone(model):
    """A 'fine-tuned' copy of the target, as a Medusa-2 checkpoint's backbone would be."""
    tuned = copy.deepcopy(model)
    with torch.no_grad():
        tuned.model.layers[1].mlp.up_proj.weight.add_(0.01)
    return tuned


def build_layout(name: str, root: Path, model) -> tuple[Path, dict[str, torch.Tensor]]:
    """(directory, expected draftheads tensors) for one official layout."""
    d = root / name
    if name in ("medusa-v1-pt", "medusa-v1-safetensors"):
        layers = 1 if name.endswith("pt") else 2
        sd = medusa_v1_tensors(3, layers, with_lm_head=True)
        # The released config is wrong about the head count; the keys decide.
        cfg = {"base_model_name_or_path": "tiny-llama", "medusa_num_heads": 2, "medusa_num_layers": layers}
        write(d, cfg, sd, "medusa_lm_head.pt" if name.endswith("pt") else "medusa_lm_head.safetensors")
        exp = {}
        for h in range(3):
            for j in range(layers):
                exp[f"blocks.{h}.{j}.linear.weight"] = sd[f"{h}.{j}.linear.weight"]
                exp[f"blocks.{h}.{j}.linear.bias"] = sd[f"{h}.{j}.linear.bias"]
            exp[f"lm_heads.{h}.weight"] = sd[f"{h}.{layers}.weight"]
        return d, exp
    if name == "medusa-v2":
        sd = medusa_v1_tensors(2, 1, with_lm_head=False)
        write(
            d,
            {"base_model_name_or_path": "tiny-llama", "medusa_num_heads": 2, "version": "2"},
            sd,
            "medusa_lm_head.safetensors",
        )
        return d, {f"blocks.{k}": v for k, v in sd.items()}
    if name == "medusa-2":
        tuned = tuned_backbone(model)
        heads = medusa_v1_tensors(2, 1, with_lm_head=True, dtype=torch.float32)
        sd = {**tuned.state_dict(), **{f"medusa_head.{k}": v for k, v in heads.items()}}
        cfg = {**tuned.config.to_dict(), "medusa_num_heads": 2, "medusa_num_layers": 1}
        write(d, cfg, sd, "model.safetensors")
        exp = {
            f"blocks.{h}.0.linear.{w}": heads[f"{h}.0.linear.{w}"]
            for h in range(2)
            for w in ("weight", "bias")
        }
        exp.update({f"lm_heads.{h}.weight": heads[f"{h}.1.weight"] for h in range(2)})
        return d, exp
    if name == "eagle-1":
        sd = eagle1_tensors(model, layers=2)
        write(d, llama_config(num_hidden_layers=2), sd, "pytorch_model.bin")
        return d, {k: v for k, v in sd.items() if k != "embed_tokens.weight"}
    if name == "eagle-3":
        sd = eagle3_tensors()
        write(
            d,
            llama_config(draft_vocab_size=300, architectures=["LlamaForCausalLMEagle3"]),
            sd,
            "model.safetensors",
        )
        exp = {
            (
                "hidden_norm.weight"
                if k == "midlayer.hidden_norm.weight"
                else k.replace("midlayer.", "layers.0.")
            ): v
            for k, v in sd.items()
        }
        return d, exp
    raise AssertionError(name)


def runs_on_target_features(drafter: Drafter, target) -> torch.Tensor:
    """One drafter pass on the target's own hidden states; returns the draft logits."""
    ids = torch.tensor([[1, 17, 230, 4000, 9]])
    with torch.no_grad():
        feats = drafter.select_features(target(ids, output_hidden_states=True).hidden_states)
        if isinstance(drafter, MedusaHeads):
            logits = drafter(feats)
            assert logits.shape == (drafter.num_heads, 1, 5, V)
            return logits
        pos = torch.arange(4)[None]
        out = drafter(ids[:, 1:], drafter.fuse(feats[:, :-1]), pos)
        logits = drafter.logits(out)
    assert logits.shape == (1, 4, drafter.draft_vocab_size)
    return logits


LAYOUTS = ["medusa-v1-pt", "medusa-v1-safetensors", "medusa-v2", "medusa-2", "eagle-1", "eagle-3"]


def target_for(name: str, model):
    return tuned_backbone(model) if name == "medusa-2" else model


@pytest.mark.parametrize("name", LAYOUTS)
def test_import_converts_each_layout_with_exact_weights(tmp_path, tiny_llama, name):
    model, tok, fp = tiny_llama
    d, expected = build_layout(name, tmp_path, model)
    target = target_for(name, model)
    drafter = Drafter.from_pretrained(d, target=target, tokenizer=tok)
    sd = drafter.state_dict()
    assert sorted(sd) == sorted(expected)
    for k, v in expected.items():
        assert torch.equal(sd[k], v.to(sd[k].dtype)), k  # bf16/fp16 -> fp32 is exact
    assert drafter.target_fingerprint == fp  # from the target the user loaded it with
    assert runs_on_target_features(drafter, target).isfinite().all()
    assert drafter.provenance["imported_from"]["layout"] == detect_layout(d).layout
    if name.startswith("medusa"):
        assert isinstance(drafter, MedusaHeads)
        assert drafter.num_heads == (3 if "v1" in name else 2)  # from the keys, not the config
        assert drafter.lm_head_mode == ("shared" if name == "medusa-v2" else "copy")
    else:
        assert isinstance(drafter, EagleDrafter) and drafter.version == int(name[-1])
        assert "embed_tokens.weight" not in sd  # the target's embedding is shared, not copied


def test_medusa_import_computes_the_official_formula(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    d, _ = build_layout("medusa-v1-safetensors", tmp_path, model)
    from safetensors.torch import load_file

    official = {k: v.float() for k, v in load_file(str(d / "medusa_lm_head.safetensors")).items()}
    heads = MedusaHeads.from_pretrained(d, target=model, tokenizer=tok)
    h = torch.randn(1, 3, H)
    out = heads(h)
    for k in range(3):
        x = h
        for j in range(2):  # x + SiLU(W x + b), then the head's own lm_head
            x = x + F.silu(F.linear(x, official[f"{k}.{j}.linear.weight"], official[f"{k}.{j}.linear.bias"]))
        torch.testing.assert_close(out[k], F.linear(x, official[f"{k}.2.weight"]))


def speculative_generator():
    decode = pytest.importorskip("draftheads.decode")
    if not hasattr(decode, "SpeculativeGenerator"):
        pytest.skip("draftheads.decode.SpeculativeGenerator is not available yet")
    return decode.SpeculativeGenerator


@pytest.mark.parametrize("name", ["medusa-v1-pt", "medusa-v2", "medusa-2", "eagle-1", "eagle-3"])
def test_imported_drafter_decodes_exactly_like_the_target(tmp_path, tiny_llama, name):
    SpeculativeGenerator = speculative_generator()
    model, tok, _ = tiny_llama
    d, _ = build_layout(name, tmp_path, model)
    target = target_for(name, model)
    drafter = Drafter.from_pretrained(d, target=target, tokenizer=tok)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    ref = target.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    out = SpeculativeGenerator(target, drafter).generate(ids, max_new_tokens=6)
    out = getattr(out, "sequences", out)
    assert torch.equal(out, ref)


def test_imported_drafter_round_trips_through_the_draftheads_format(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    d, _ = build_layout("eagle-3", tmp_path, model)
    imported = Drafter.from_pretrained(d, target=model, tokenizer=tok)
    imported.save_pretrained(tmp_path / "saved")
    back = Drafter.from_pretrained(tmp_path / "saved", target=model, tokenizer=tok)
    a, b = imported.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert back.provenance["imported_from"]["layout"] == "eagle-3"


def test_eagle3_aux_layer_ids_follow_each_engine_convention(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    sd = eagle3_tensors()
    vllm_style = write(
        tmp_path / "a",
        llama_config(draft_vocab_size=300, eagle_aux_hidden_state_layer_ids=[1, 2, 3]),
        sd,
        "model.safetensors",
    )
    sglang_style = write(
        tmp_path / "b",
        llama_config(
            draft_vocab_size=300,
            eagle_config={"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
        ),
        sd,
        "model.safetensors",
    )
    default = write(tmp_path / "c", llama_config(draft_vocab_size=300), sd, "model.safetensors")
    assert Drafter.from_pretrained(vllm_style, target=model).feature_layers() == [1, 2, 3]
    assert Drafter.from_pretrained(sglang_style, target=model).feature_layers() == [1, 2, 3]
    assert Drafter.from_pretrained(default, target=model).feature_layers() == [1, 2, 3]  # distinct, from 1


def test_medusa2_heads_are_refused_with_the_original_base_model(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    d, _ = build_layout("medusa-2", tmp_path, model)
    with pytest.raises(UserError, match="fine-tuned backbone.*never pair") as e:
        Drafter.from_pretrained(d, target=model, tokenizer=tok)
    assert "\n" not in str(e.value) and "mlp.up_proj" in str(e.value)


def test_import_needs_the_target(tmp_path, tiny_llama):
    model, _, _ = tiny_llama
    d, _ = build_layout("medusa-v2", tmp_path, model)
    with pytest.raises(UserError, match="needs its target model"):
        Drafter.from_pretrained(d)


def test_import_refuses_a_checkpoint_for_another_target(tmp_path, tiny_llama):
    model, _, _ = tiny_llama
    sd = {
        "0.0.linear.weight": torch.zeros(32, 32),
        "0.0.linear.bias": torch.zeros(32),
        "0.1.weight": torch.zeros(100, 32),
    }
    d = write(tmp_path / "m", {"base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}, sd, "medusa_lm_head.pt")
    with pytest.raises(UserError, match=r"trained for another target \(lmsys/vicuna-7b-v1.3\)"):
        Drafter.from_pretrained(d, target=model)


def test_eagle1_with_another_targets_embedding_is_refused(tmp_path, tiny_llama):
    model, _, _ = tiny_llama
    sd = eagle1_tensors(model)
    sd["embed_tokens.weight"] = sd["embed_tokens.weight"] + 1.0
    d = write(tmp_path / "e", llama_config(), sd, "pytorch_model.bin")
    with pytest.raises(UserError, match="embed_tokens copy differs"):
        Drafter.from_pretrained(d, target=model)


@pytest.mark.parametrize(
    "case,match",
    [
        ("unknown-keys", "neither a draftheads checkpoint .* nor an official"),
        ("stray-medusa-key", "unexpected key 'extra.weight'"),
        ("medusa-gap", r"not 0..n-1"),
        ("missing-shard", "is missing; the download is incomplete"),
        ("corrupt-pickle", "cannot read it as a weights-only torch checkpoint"),
        ("code-pickle", "cannot read it as a weights-only torch checkpoint"),
        ("eagle3-no-d2t", "needs lm_head.weight and d2t"),
        ("wrong-class", "holds a drafter of kind 'eagle', not 'medusa'"),
    ],
)
def test_import_errors_are_one_line(tmp_path, tiny_llama, case, match):
    model, _, _ = tiny_llama
    d = tmp_path / case
    if case == "unknown-keys":
        write(d, {"model_type": "llama"}, {"foo.weight": torch.zeros(2)}, "model.safetensors")
    elif case == "stray-medusa-key":
        write(
            d,
            {},
            {**medusa_v1_tensors(1, 1, False), "extra.weight": torch.zeros(2)},
            "medusa_lm_head.safetensors",
        )
    elif case == "medusa-gap":
        sd = medusa_v1_tensors(3, 1, False)
        write(d, {}, {k: v for k, v in sd.items() if not k.startswith("1.")}, "medusa_lm_head.safetensors")
    elif case == "missing-shard":
        write(d, {"model_type": "llama"}, {}, "unused.bin")
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"fc.weight": "model-00001-of-00002.safetensors"}})
        )
    elif case == "corrupt-pickle":
        d.mkdir()
        (d / "medusa_lm_head.pt").write_bytes(b"not a pickle at all")
    elif case == "code-pickle":
        d.mkdir()
        torch.save({"0.0.linear.weight": torch.zeros(2), "hook": Path("/")}, d / "medusa_lm_head.pt")
    elif case == "eagle3-no-d2t":
        sd = eagle3_tensors()
        del sd["d2t"]
        write(d, llama_config(), sd, "model.safetensors")
    elif case == "wrong-class":
        write(d, llama_config(), eagle1_tensors(model), "pytorch_model.bin")
    with pytest.raises(UserError, match=match) as e:
        (MedusaHeads if case == "wrong-class" else Drafter).from_pretrained(d, target=model)
    assert "\n" not in str(e.value)
