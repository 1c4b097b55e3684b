"""P-EAGLE's export and import through the kind registry: ``format=speculators`` writes speculators'
``peagle`` layout, which ``PEagleDraftModel`` loads with no missing or unexpected keys and which
``Drafter.from_pretrained`` imports back as the same drafter; ``format=vllm``/``sglang``, another
kind's checkpoint loaded as P-EAGLE and a speculators directory of an unknown type are each
refused in one line, with nothing written."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import TargetConfig
from draftheads.heads import Drafter, PEagleDrafter
from draftheads.heads.export import export, export_drafter
from tests.test_export import eagle
from tests.test_peagle_draft import K, peagle
from tests.test_peagle_oracle import saved_target, speculators_classes


def cli(heads, out, fmt: str) -> Config:
    cfg = Config(heads=str(heads), format=fmt, out=str(out))
    cfg.target = TargetConfig(name_or_path="tiny-llama", tiny="llama")
    return cfg


@pytest.mark.parametrize("own", [False, True])
def test_speculators_export_loads_in_peagle_draft_model_and_imports_back(tmp_path, tiny_llama, own):
    model, tok, fp = tiny_llama
    d = peagle(model, fp, seed=3, own_embedding=own)
    verifier = saved_target(tmp_path / "models" / "tiny-llama", model, tok)
    out = export_drafter(d, "speculators", tmp_path / "spec", verifier=str(verifier))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "peagle" and cfg["architectures"] == ["PEagleSpeculator"]
    assert cfg["speculators_config"]["algorithm"] == "peagle" and cfg["mask_token_id"] == d.mask_token_id
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    _, _, model_cls, _, _ = speculators_classes()
    from speculators.models.eagle3.core import Eagle3DraftModel

    model_cls.from_pretrained(str(out))  # its own loader, which resolves the layers on the verifier
    _, info = super(Eagle3DraftModel, model_cls).from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    back = Drafter.from_pretrained(out, target=model, tokenizer=tok)
    same = {k: v for k, v in d.spec().items() if k != "target_config"}  # saving the verifier names its class
    assert isinstance(back, PEagleDrafter) and {k: back.spec()[k] for k in same} == same
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())
    assert back.provenance["imported_from"]["layout"] == "speculators-peagle"


@pytest.mark.parametrize("own", [False, True])
def test_the_export_command_writes_a_saved_drafter_with_the_targets_embedding(tmp_path, tiny_llama, own):
    """``draftheads export format=speculators`` on a saved P-EAGLE checkpoint: the layout holds an
    input embedding, the target's with the drafter's mask row, so the command loads the target
    for it (or the drafter's own copy with ``own_embedding``)."""
    model, tok, fp = tiny_llama
    d = peagle(model, fp, seed=3, own_embedding=own)
    d.save_pretrained(tmp_path / "src")
    export(cli(tmp_path / "src", tmp_path / "out", "speculators"))
    back = Drafter.from_pretrained(tmp_path / "out", target=model, tokenizer=tok)
    assert torch.equal(back.input_embedding(), d.input_embedding())
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_engine_layouts_are_refused_naming_the_speculators_format(tmp_path, tiny_llama, fmt):
    model, _, fp = tiny_llama
    peagle(model, fp).save_pretrained(tmp_path / "src")
    with pytest.raises(UserError, match=f"format={fmt}: .*export it with format=speculators") as err:
        export(cli(tmp_path / "src", tmp_path / "out", fmt))
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_another_kinds_checkpoint_loaded_as_peagle_is_refused_in_one_line(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    e3 = eagle(model, fp, 3, feature_layers=[1, 2, 3])
    e3.save_pretrained(tmp_path / "ours")
    export_drafter(e3, "speculators", tmp_path / "spec")
    for folder, match in (
        (tmp_path / "ours", "holds a eagle drafter, not a peagle"),
        (tmp_path / "spec", "kind 'eagle', not 'peagle'"),
    ):
        with pytest.raises(UserError, match=match) as err:
            PEagleDrafter.from_pretrained(folder, target=model, tokenizer=tok)
        assert "\n" not in str(err.value)


def test_a_speculators_directory_of_an_unknown_type_is_refused_and_nothing_is_written(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    src = export_drafter(peagle(model, fp), "speculators", tmp_path / "spec")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "speculators_model_type": "peagle9"}))
    with pytest.raises(UserError, match="unknown speculators_model_type 'peagle9'; draftheads reads") as err:
        Drafter.from_pretrained(src, target=model, tokenizer=tok)
    assert "\n" not in str(err.value) and "peagle" in str(err.value).split("reads")[1]
    with pytest.raises(UserError, match="unknown speculators_model_type 'peagle9'"):
        export(cli(src, tmp_path / "out", "speculators"))
    assert not (tmp_path / "out").exists()
