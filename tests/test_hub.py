"""Publishing to and loading from the Hub, against the loopback FakeHub (no network): push with a
model card, from_pretrained by repo id and revision, offline from the cache, the token never shown."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from huggingface_hub import ModelCard, constants

from draftheads.conf.errors import UserError
from draftheads.heads import Drafter, EagleDrafter, MedusaHeads
from tests.test_hub_fake import serve_hub

TOKEN = "hf_fakeSecretToken0123456789abcdef"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = serve_hub(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield server
    server.__exit__(None, None, None)


def run_cli(command: str, overrides: list[str]) -> int:
    """``draftheads <command> ...`` through the real command line; returns its exit code."""
    from draftheads.conf.cli import main

    return main([command, *overrides])


def trained(kind: str, model, fp) -> Drafter:
    if kind == "medusa":
        d = MedusaHeads(fp, num_heads=3, num_layers=1, lm_head="shared")
    else:
        d = EagleDrafter(fp, target_config=model.config.to_dict(), version=3, draft_vocab_size=300)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    d.provenance = {
        "data": {"name": "HuggingFaceH4/ultrachat_200k", "rows": 1000},
        "train": {"lr": 0.001, "steps": 50},
    }
    return d.attach(model)


def same_drafter(a: Drafter, b: Drafter) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return (
        sa.keys() == sb.keys()
        and all(torch.equal(sa[k], sb[k]) for k in sa)
        and a.config_dict() == b.config_dict()
    )


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_push_then_from_pretrained_returns_the_same_drafter(hub, tmp_path, tiny_llama, kind, capsys, caplog):
    model, tok, fp = tiny_llama
    d = trained(kind, model, fp)
    heads = d.save_pretrained(tmp_path / "heads")
    report = {"tau": 2.71, "speedup": 1.83, "tokens_per_s": 51.2, "baseline_tokens_per_s": 28.0}
    (heads / "report.json").write_text(json.dumps(report))
    caplog.set_level(logging.DEBUG)
    assert run_cli("push", [f"heads={heads}", f"repo_id=org/{kind}-heads", "private=true"]) == 0
    printed = capsys.readouterr()
    assert TOKEN not in printed.out + printed.err + caplog.text  # never printed or logged...
    assert hub.auth_headers and all(h == f"Bearer {TOKEN}" for h in hub.auth_headers)  # ...but used
    assert hub.repos[f"org/{kind}-heads"].private

    back = Drafter.from_pretrained(f"org/{kind}-heads", target=model, tokenizer=tok)
    assert type(back) is type(d) and same_drafter(back, d)

    card = ModelCard.load(f"org/{kind}-heads")
    meta = card.data.to_dict()
    assert meta["library_name"] == "draftheads"
    assert {"speculative-decoding", kind} <= set(meta["tags"])
    assert meta["datasets"] == ["HuggingFaceH4/ultrachat_200k"]
    assert "base_model" not in meta  # tiny-llama is not a Hub id; a real target's name is
    text = card.text
    assert "2.71" in text and "1.83×" in text and '"lr": 0.001' in text
    assert "Drafter.from_pretrained" in text and "vllm serve tiny-llama" in text
    assert ("--speculative-algorithm EAGLE3" in text) == (kind == "eagle")
    assert ("SGLang does not support Medusa" in text) == (kind == "medusa")


def test_card_links_the_target_as_base_model(tiny_llama):
    from draftheads.heads.hub import model_card

    model, _, fp = tiny_llama
    conf = trained("medusa", model, fp).config_dict()
    conf["target"]["name"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    meta = model_card(conf, "org/x").data.to_dict()
    assert (
        meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        and meta["base_model_relation"] == "adapter"
    )
    assert "No evaluation report" in model_card(conf, "org/x").text


def test_push_to_hub_revision_and_offline_cache(hub, monkeypatch, tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    d = trained("eagle", model, fp)
    d.push_to_hub("org/eagle3")
    d2 = trained("eagle", model, fp)
    with torch.no_grad():
        d2.fc.weight.add_(1.0)
    d2.push_to_hub("org/eagle3", revision="v2")  # a branch, created on the fly
    v1 = Drafter.from_pretrained("org/eagle3", target=model, tokenizer=tok)
    v2 = Drafter.from_pretrained("org/eagle3", target=model, tokenizer=tok, revision="v2")
    assert same_drafter(v1, d) and same_drafter(v2, d2)
    main_sha = hub.repos["org/eagle3"].branches["main"]
    pinned = Drafter.from_pretrained("org/eagle3", target=model, revision=main_sha)
    assert same_drafter(pinned, d)

    # Offline: everything comes from the cache, and the server is never asked.
    hub.requests.clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert same_drafter(Drafter.from_pretrained("org/eagle3", target=model, tokenizer=tok), d)
    assert same_drafter(Drafter.from_pretrained("org/eagle3", target=model, revision="v2"), d2)
    assert hub.requests == []
    with pytest.raises(UserError, match="cannot fetch it from the Hugging Face Hub"):
        Drafter.from_pretrained("org/never-downloaded", target=model)


def test_push_errors_are_one_line(hub, tmp_path, tiny_llama, capsys):
    from draftheads.heads.hub import push_folder

    model, _, fp = tiny_llama
    heads = trained("medusa", model, fp).save_pretrained(tmp_path / "heads")
    with pytest.raises(UserError, match="not a Hub repo id"):
        push_folder(heads, "no-namespace")
    with pytest.raises(UserError, match="no such checkpoint directory"):
        push_folder(tmp_path / "nowhere", "org/x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        push_folder(tmp_path / "empty", "org/x")
    (heads / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(UserError, match="truncated or corrupt"):
        push_folder(heads, "org/x")
    heads = trained("medusa", model, fp).save_pretrained(tmp_path / "heads")
    conf = json.loads((heads / "config.json").read_text())
    conf["spec"]["num_layers"] = 2  # config.json and the weights disagree
    (heads / "config.json").write_text(json.dumps(conf))
    with pytest.raises(UserError, match="does not match the drafter in config.json"):
        push_folder(heads, "org/x")
    assert "org/x" not in hub.repos  # nothing was published
    assert run_cli("push", [f"heads={heads}"]) == 1
    assert capsys.readouterr().err.strip() == "error: draftheads push needs heads=DIR and repo_id=ORG/NAME"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "report.json").write_text("{}")
    with pytest.raises(UserError, match="not a draftheads eval report"):
        push_folder(
            trained("medusa", model, fp).save_pretrained(tmp_path / "h2"), "org/y", report=tmp_path / "bad"
        )


def test_from_pretrained_unknown_repo_is_one_line(hub, tiny_llama):
    model, _, _ = tiny_llama
    with pytest.raises(UserError, match="heads=org/missing: cannot fetch it") as e:
        Drafter.from_pretrained("org/missing", target=model)
    assert "\n" not in str(e.value)


def test_official_checkpoint_from_the_hub_is_imported(hub, tiny_llama):
    """An official Medusa repo (config.json + medusa_lm_head.safetensors) resolves and converts."""
    import io

    from huggingface_hub import CommitOperationAdd, HfApi
    from safetensors.torch import save

    model, tok, _ = tiny_llama
    sd = {"0.0.linear.weight": torch.randn(64, 64), "0.0.linear.bias": torch.randn(64)}
    api = HfApi()
    api.create_repo("FasterDecoding/medusa-tiny")
    api.create_commit(
        "FasterDecoding/medusa-tiny",
        [
            CommitOperationAdd("config.json", json.dumps({"medusa_num_heads": 5, "version": "2"}).encode()),
            CommitOperationAdd("medusa_lm_head.safetensors", io.BytesIO(save(sd))),
        ],
        commit_message="heads",
    )
    heads = Drafter.from_pretrained("FasterDecoding/medusa-tiny", target=model, tokenizer=tok)
    assert torch.equal(heads.state_dict()["blocks.0.0.linear.weight"], sd["0.0.linear.weight"])
    assert heads.provenance["imported_from"]["source"] == "FasterDecoding/medusa-tiny"


def test_push_uploads_adapters_tree_and_the_latest_eval_report(hub, tmp_path, tiny_llama):
    import os

    from draftheads.heads.hub import push_folder

    model, tok, fp = tiny_llama
    d = trained("medusa", model, fp)
    d.requires_adapters = True  # a Medusa-2 checkpoint: heads + the target's LoRA adapters
    heads = d.save_pretrained(tmp_path / "heads")
    with pytest.raises(UserError, match="needs its adapter/"):
        push_folder(heads, "org/m2")
    (heads / "adapter").mkdir()
    (heads / "adapter" / "adapter_config.json").write_text("{}")
    (heads / "tree.json").write_text('{"choices": [[0], [0, 0]]}')
    (heads / "checkpoints" / "step-10").mkdir(parents=True)
    (heads / "checkpoints" / "step-10" / "optim.pt").write_bytes(b"x" * 100)
    (heads / "report.json").write_text(json.dumps({"tau": 1.5, "speedup": 1.1, "heads": str(heads)}))
    evals = tmp_path / "eval"
    evals.mkdir()
    (evals / "report.json").write_text(json.dumps({"tau": 2.25, "speedup": 1.6, "heads": str(heads)}))
    os.utime(heads / "report.json", (1, 1))  # the eval directory's report is the newer one
    push_folder(heads, "org/m2", search=(evals,))
    repo = hub.repos["org/m2"]
    files = repo.commits[repo.branches["main"]]
    assert {
        "config.json",
        "model.safetensors",
        "README.md",
        "tree.json",
        "adapter/adapter_config.json",
    } <= set(files)
    assert not any(f.startswith("checkpoints/") for f in files)
    assert json.loads(files["report.json"])["tau"] == 2.25
    card = files["README.md"].decode()
    assert "2.25" in card and "puts them on the target" in card and "medusa-2" in card
