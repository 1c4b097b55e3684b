"""The embedded SmolLM2 target and the tiny targets load, and identify themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import TargetConfig
from draftheads.heads.target.fingerprint import fingerprint
from draftheads.heads.target.load import load_target, resolve_dtype

# Recorded once from SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to fp32), greedy, 24 tokens:
# '```python\ndef reverse_string(input_str):\n    return input_str[::-1]\n```\n\n'
SMOLLM2_GREEDY = [
    3725,
    5367,
    198,
    1604,
    8535,
    79,
    5931,
    24,
    4525,
    79,
    1321,
    727,
    472,
    1003,
    3007,
    79,
    1321,
    43788,
    33,
    77,
    198,
    3725,
    198,
    198,
]


@pytest.mark.slow
def test_smollm2_greedy_continuation_matches_recorded_tokens(smollm2):
    model, tok = smollm2
    fp = fingerprint(model, tok)
    assert (fp.architecture, fp.hidden_size, fp.vocab_size, fp.num_layers) == (
        "LlamaForCausalLM",
        576,
        49152,
        30,
    )
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that reverses a string."}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    assert out[0, enc["input_ids"].shape[1] :].tolist() == SMOLLM2_GREEDY


def test_tiny_targets_are_deterministic_and_frozen(tiny):
    kind, model, tok, fp = tiny
    again, _ = load_target(TargetConfig(name_or_path=f"tiny-{kind}", tiny=kind))
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), again.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert not any(p.requires_grad for p in model.parameters())
    assert fp.vocab_size == len(tok) and fp.hidden_size == 64 and fp.num_layers == 4


def test_fingerprint_tracks_the_tokenizer(tiny_llama):
    model, tok, fp = tiny_llama
    tok2 = type(tok).from_pretrained(tok.name_or_path)
    tok2.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert fingerprint(model, tok2).tokenizer_hash != fp.tokenizer_hash


def test_a_remembered_tokenizer_hash_follows_the_tokenizers_changes(tiny_llama):
    from draftheads.heads.target.fingerprint import tokenizer_hash

    _, tok, fp = tiny_llama
    tok2 = type(tok).from_pretrained(tok.name_or_path)
    tok2.pad_token = tok2.eos_token
    first = tokenizer_hash(tok2)
    assert first == fp.tokenizer_hash and tokenizer_hash(tok2) == first
    tok2.chat_template = "{{ messages[0]['content'] }}"
    templated = tokenizer_hash(tok2)
    fresh = type(tok).from_pretrained(tok.name_or_path)
    fresh.pad_token, fresh.chat_template = fresh.eos_token, tok2.chat_template
    assert templated != first and templated == tokenizer_hash(fresh)
    tok2.add_tokens(["<draft-test-token>"])
    assert tokenizer_hash(tok2) not in (first, templated)


def test_bad_target_options_are_one_line_errors():
    with pytest.raises(UserError, match="target.dtype=float8"):
        resolve_dtype("float8")
    with pytest.raises(UserError, match="target.tiny=rnn"):
        load_target(TargetConfig(name_or_path="tiny-rnn", tiny="rnn"))
    with pytest.raises(UserError, match="cannot load"):
        load_target(TargetConfig(name_or_path="/nonexistent/model"))


def test_target_hf_without_a_name_is_refused_when_read():
    """conf/target/hf.yaml names no model: reading it must not fall back to the embedded SmolLM2."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    hf = OmegaConf.load(str(files("draftheads.conf") / "target" / "hf.yaml"))
    with pytest.raises(UserError, match="target.name_or_path is not set") as e:
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TargetConfig), hf))
    assert "\n" not in str(e.value)
    named = OmegaConf.merge(OmegaConf.structured(TargetConfig), hf, {"name_or_path": "org/model"})
    assert OmegaConf.to_object(named).name_or_path == "org/model"


def test_fingerprint_records_the_architecture_and_a_weight_sample(tiny_llama):
    from draftheads.heads.target.fingerprint import TargetFingerprint

    model, tok, fp = tiny_llama
    assert fp.model_type == "llama" and len(fp.weight_sample) > 0
    assert TargetFingerprint.from_dict(fp.to_dict()) == fp
    bf16, btok = load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama", dtype="bfloat16"))
    assert fingerprint(bf16, btok).mismatches(fp) == []  # a bf16 load is the same target
    other, otok = load_target(TargetConfig(name_or_path="tiny-llama", tiny="llama", seed=7))
    assert fingerprint(other, otok).mismatches(fp) == ["weights"]


def test_installed_package_has_one_import_name(tmp_path):
    """From outside the repository only ``draftheads.*`` is importable (the wheel holds nothing
    else: tests/test_packaging.py builds it)."""
    code = (
        "import importlib.util, draftheads.heads, draftheads.decode, draftheads.train, draftheads.data;"
        "print([m for m in ('train','data','heads','decode','conf') if importlib.util.find_spec(m)])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr


def test_target_config_refuses_unknown_tiny_kinds_and_dtypes_when_read():
    from draftheads.conf.schema.heads import DTYPE_NAMES, TINY_KINDS
    from draftheads.heads.target.load import DTYPES, TINY_CONFIGS

    assert set(TINY_KINDS) == set(TINY_CONFIGS) and set(DTYPE_NAMES) == set(DTYPES)
    for kwargs, match in [(dict(tiny="rnn"), "target.tiny=rnn"), (dict(dtype="int8"), "target.dtype=int8")]:
        with pytest.raises(UserError, match=match) as e:
            TargetConfig(**kwargs)
        assert "\n" not in str(e.value)


def test_the_embedded_conversion_is_whole_on_any_rank_and_replaces_an_incomplete_one(
    tmp_path, monkeypatch, tiny_llama
):
    """What a conversion writes on a rank other than 0 (where ``save_pretrained`` writes no
    weights) is whole, and it replaces a cached folder that lost its weights; the same model
    loads back from it."""
    from transformers import AutoModelForCausalLM, PreTrainedModel

    from draftheads.heads.target.embedded import install, is_converted, save_converted

    model, tok, _ = tiny_llama
    broken = tmp_path / "smollm2-135m-instruct"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(PreTrainedModel, "should_save_on_this_rank", lambda self, is_main_process: False)
    save_converted(model, tok, tmp_path / "mine.tmp")
    out = install(tmp_path / "mine.tmp", broken)
    assert out == broken and is_converted(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no private folders left
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 50, 345, 314]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    save_converted(model, tok, tmp_path / "late.tmp")  # another process finishing later keeps it
    assert install(tmp_path / "late.tmp", out) == out and not (tmp_path / "late.tmp").exists()


def test_a_tokenizer_loaded_again_is_a_fresh_copy_until_its_files_change(tmp_path):
    from draftheads.heads.target.fingerprint import tokenizer_hash
    from draftheads.heads.target.load import load_tokenizer
    from tests.conftest import get_target

    _, tok = get_target("llama")
    tok.save_pretrained(tmp_path / "t")
    cfg = TargetConfig(name_or_path=str(tmp_path / "t"))
    first, second = load_tokenizer(cfg), load_tokenizer(cfg)
    assert first is not second and tokenizer_hash(second) == tokenizer_hash(tok)
    first.chat_template = "{{ messages[0]['content'] }}"
    first.add_tokens(["<only-in-the-first>"])
    third = load_tokenizer(cfg)  # what the caller changed stays with its copy
    assert len(third) == len(tok) and third.chat_template == tok.chat_template
    assert tokenizer_hash(third) == tokenizer_hash(tok) != tokenizer_hash(first)
    # new files in the folder: loaded from disk again
    first.save_pretrained(tmp_path / "t")
    again = load_tokenizer(cfg)
    assert len(again) == len(first) and tokenizer_hash(again) == tokenizer_hash(first)


# ---- the converted folder as engines read it ---------------------------------------------------
def tied_llama():
    """A tiny Llama whose lm_head is its embedding, as SmolLM2's is."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(3)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def tensors_in(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def config_in(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_a_cached_conversion_without_architectures_gets_them_on_read(tmp_path, capsys):
    """A conversion cached before its config named the model class is completed in place when
    it is next used: the config gains ``architectures``, the weights stay, nothing is printed."""
    from draftheads.heads.target.embedded import save_converted, usable_conversion
    from tests.conftest import get_target

    cached = tmp_path / "smollm2-135m-instruct"
    save_converted(tied_llama(), get_target("llama")[1], cached)
    old = {k: v for k, v in config_in(cached).items() if k != "architectures"}
    (cached / "config.json").write_text(json.dumps(old))
    weights = (cached / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert usable_conversion(cached) and capsys.readouterr().err == ""
    assert config_in(cached) == {**old, "architectures": ["LlamaForCausalLM"]}
    assert (cached / "model.safetensors").stat().st_mtime_ns == weights


def test_a_speculators_export_names_the_architecture_of_a_converted_verifier(tmp_path, tiny_llama):
    """A verifier folder written as the conversion writes one records its model class in the
    export's ``verifier.architectures``; a folder whose config names none is refused in one line."""
    from draftheads.heads.export import export_drafter
    from draftheads.heads.target.embedded import save_converted
    from tests.test_dflash_formats import dflash

    model, tok, fp = tiny_llama
    save_converted(model, tok, tmp_path / "verifier")
    out = export_drafter(
        dflash(model, fp), "speculators", tmp_path / "out", verifier=str(tmp_path / "verifier")
    )
    verifier = config_in(out)["speculators_config"]["verifier"]
    assert (
        verifier["architectures"] == config_in(tmp_path / "verifier")["architectures"] == ["LlamaForCausalLM"]
    )
    (tmp_path / "verifier" / "config.json").write_text(
        json.dumps({k: v for k, v in config_in(tmp_path / "verifier").items() if k != "architectures"})
    )
    with pytest.raises(UserError, match="its config.json names no architectures") as err:
        export_drafter(
            dflash(model, fp), "speculators", tmp_path / "again", verifier=str(tmp_path / "verifier")
        )
    assert "\n" not in str(err.value) and not (tmp_path / "again").exists()


def speculators_verifier(folder: Path, config):
    """speculators' own verifier loading (``load_verifier_weights``) of ``folder``, into a
    one-layer EAGLE-3 drafter over the full vocabulary: its embedding, lm_head and final norm."""
    pytest.importorskip(
        "speculators", reason="speculators is not installed (see the interop extra in pyproject.toml)"
    )
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layers = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
    layers._attn_implementation = "eager"
    spec = Eagle3DraftModel(
        Eagle3SpeculatorConfig(
            transformer_layer_config=layers,
            draft_vocab_size=config.vocab_size,
            speculators_config=SpeculatorsConfig(
                algorithm="eagle3",
                proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                default_proposal_method="greedy",
                verifier=VerifierConfig(name_or_path=str(folder), architectures=["LlamaForCausalLM"]),
            ),
        )
    )
    spec.embed_tokens.weight.data.fill_(float("nan"))  # unloaded, as speculators marks it
    spec.lm_head.weight.data.fill_(float("nan"))
    spec.load_verifier_weights()
    return spec


def agree_with_speculators(folder: Path, model) -> None:
    spec = speculators_verifier(folder, model.config)
    assert torch.equal(spec.embed_tokens.weight, model.get_input_embeddings().weight)
    assert torch.equal(spec.verifier_lm_head.weight, model.get_output_embeddings().weight)
    assert torch.equal(spec.verifier_norm.weight, model.model.norm.weight)


def test_a_converted_tied_target_is_written_as_save_pretrained_writes_it(tmp_path):
    """The tied embedding is stored as model.embed_tokens.weight (no lm_head.weight), the same
    tensors save_pretrained writes; transformers and speculators' verifier loading read it back
    as the model it was."""
    from transformers import AutoModelForCausalLM

    from draftheads.heads.target.embedded import save_converted
    from tests.conftest import get_target

    model, tok = tied_llama(), get_target("llama")[1]
    save_converted(model, tok, tmp_path / "ours")
    model.save_pretrained(tmp_path / "theirs")
    ours, theirs = tensors_in(tmp_path / "ours"), tensors_in(tmp_path / "theirs")
    assert "model.embed_tokens.weight" in ours and "lm_head.weight" not in ours
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert config_in(tmp_path / "ours") == config_in(tmp_path / "theirs")
    assert config_in(tmp_path / "ours")["architectures"] == ["LlamaForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    ids = torch.tensor([[1, 50, 245, 14]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    agree_with_speculators(tmp_path / "ours", model)


def test_an_old_layout_conversion_is_named_in_one_line_and_replaced(tmp_path, capsys):
    """A cached folder from the older layout (the tied embedding only as lm_head.weight) is not
    used: one line says why, and the new conversion replaces it."""
    from safetensors.torch import save_model

    from draftheads.heads.target.embedded import install, save_converted, usable_conversion
    from tests.conftest import get_target

    model, tok = tied_llama(), get_target("llama")[1]
    cached = tmp_path / "smollm2-135m-instruct"
    save_converted(model, tok, cached)
    save_model(model, str(cached / "model.safetensors"))  # what older versions wrote
    assert "model.embed_tokens.weight" not in tensors_in(cached)
    assert not usable_conversion(cached)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"converting the embedded SmolLM2 again into {cached}" in err
    assert "model.embed_tokens.weight" in err
    save_converted(model, tok, tmp_path / "new.tmp")
    assert install(tmp_path / "new.tmp", cached) == cached
    assert usable_conversion(cached) and capsys.readouterr().err == ""
    assert "model.embed_tokens.weight" in tensors_in(cached)
    assert not usable_conversion(tmp_path / "absent") and capsys.readouterr().err == ""


@pytest.mark.slow
def test_the_embedded_target_folder_is_read_alike_by_transformers_and_speculators(smollm2):
    """The cached SmolLM2 conversion holds its embedding under the name engines read, and
    speculators' verifier loading gets the same embedding, lm_head and norm as the target."""
    from draftheads.heads.target.embedded import convert_smollm2

    model, _ = smollm2
    folder = convert_smollm2(TargetConfig())
    assert "model.embed_tokens.weight" in tensors_in(folder)
    assert config_in(folder)["architectures"] == ["LlamaForCausalLM"]
    agree_with_speculators(folder, model)
