"""Sharded targets: ``target.device_map`` through accelerate, with part of the target on disk.

A tiny Llama saved with ``save_pretrained`` loads twice: whole, and with layers 1 and 2
offloaded to disk by accelerate (``from_pretrained`` with a device map and an offload folder).
The sharded one gives the same features, the same distilled answers and the same speculative
greedy text; the oneDNN backend packs only the layers that stay in memory. Placements that
cannot work are refused in one line before any weight is read.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from draftheads.conf.cli import parse
from draftheads.conf.commands import data as commands
from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig
from draftheads.conf.schema.heads import TargetConfig
from draftheads.data.cache.read import FeatureCache
from draftheads.data.distill.generate import GenParams, hf_generate
from draftheads.decode import SpeculativeGenerator
from draftheads.decode import backend as backends
from draftheads.heads import EagleDrafter, MedusaHeads, fingerprint, load_target
from draftheads.heads.features import target_features
from tests.conftest import get_target

# layers 1 and 2 on disk, everything else in memory
DISK_MAP = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "disk",
    "model.layers.3": "cpu",
    "model.norm": "cpu",
    "lm_head": "cpu",
}
OFFLOADED = ("model.layers.1.", "model.layers.2.")
PROMPTS = ["Hello, my name is", "def fibonacci(n):", "1 2 3 4 5 6 7 8"]
NEW = 16


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tiny Llama target as a local model directory."""
    model, tok = get_target("llama")
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def pair(saved, tmp_path_factory):
    """(whole target, target with layers 1-2 on disk, tokenizer)."""
    whole, tok = load_target(TargetConfig(name_or_path=saved))
    folder = str(tmp_path_factory.mktemp("offload"))
    sharded, _ = load_target(TargetConfig(name_or_path=saved, device_map=DISK_MAP, offload_folder=folder))
    return whole, sharded, tok


def padded(tok, prompts):
    return tok(prompts, return_tensors="pt", padding=True, padding_side="left")


def test_offloaded_layers_give_the_whole_targets_features(pair):
    whole, sharded, tok = pair
    weights = dict(sharded.named_parameters())
    assert {n for n, p in weights.items() if p.device.type == "meta"} == {
        n for n in weights if n.startswith(OFFLOADED)
    }  # layers 1-2 live on disk between calls, the rest in memory
    enc = padded(tok, PROMPTS)
    at = enc.attention_mask.bool()
    for layers in ([4], [1, 2, 3], [1, 2, 3, 4]):
        f_whole, lg_whole = target_features(whole, enc.input_ids, enc.attention_mask, layers, True)
        f_sharded, lg_sharded = target_features(sharded, enc.input_ids, enc.attention_mask, layers, True)
        torch.testing.assert_close(f_sharded, f_whole, atol=1e-6, rtol=0)
        torch.testing.assert_close(lg_sharded, lg_whole, atol=1e-6, rtol=0)
    _, some_whole = target_features(whole, enc.input_ids, enc.attention_mask, [2], logits_at=at)
    _, some_sharded = target_features(sharded, enc.input_ids, enc.attention_mask, [2], logits_at=at)
    torch.testing.assert_close(some_sharded, some_whole, atol=1e-6, rtol=0)


def drafter(kind: str, target, fp):
    torch.manual_seed(0)
    if kind == "medusa":
        d = MedusaHeads(fp, num_heads=3).attach(target)
        with torch.no_grad():
            for p in d.blocks.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        return d
    d = EagleDrafter(fp, target_config=target.config.to_dict(), version=3, draft_vocab_size=2000)
    d.attach(target).init_lm_head_from_target()
    return d


BACKENDS = ["eager"] + (["onednn"] if backends.onednn_available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_speculative_greedy_on_a_sharded_target_is_the_whole_targets(pair, kind, backend):
    whole, sharded, tok = pair
    d = drafter(kind, sharded, fingerprint(sharded, tok))
    gen = SpeculativeGenerator(sharded, d, tok, DecodeConfig(backend=backend, cost_aware=False))
    assert gen.backend == backend
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = whole.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
        out = gen.generate(ids, max_new_tokens=NEW)
        assert out.tolist() == ref.tolist(), (kind, backend, prompt)
    assert gen.last_stats.target_forwards > 1


@pytest.mark.skipif(not backends.onednn_available(), reason="this torch build has no oneDNN")
def test_onednn_leaves_the_sharded_target_stock_and_packs_the_drafter(pair):
    _, sharded, tok = pair
    d = drafter("eagle3", sharded, fingerprint(sharded, tok))
    packed = set(backends.Backend("onednn", sharded, d).packed)
    target = {m for m in sharded.modules() if isinstance(m, torch.nn.Linear)}
    own = {m for m in d.modules() if isinstance(m, torch.nn.Linear)}
    # accelerate hooks every layer of a dispatched target: the offloaded ones are swapped in per
    # call, and a resident one packed would hold its weights twice in a target sharded for memory
    assert not packed & target
    assert own and own <= packed


def test_distilled_greedy_answers_match(pair):
    whole, sharded, tok = pair
    prompts = [tok(p).input_ids for p in PROMPTS]
    params = GenParams(max_new_tokens=12, temperature=0.0, top_p=1.0)
    assert hf_generate(sharded, tok)(prompts, params, 0) == hf_generate(whole, tok)(prompts, params, 0)


def test_tiny_target_dispatched_after_building(tmp_path):
    whole, tok = get_target("llama")
    # a module mapped whole and in part: accelerate gets model's other children on cpu
    nested = {"model": "cpu", "model.layers.1": "disk", "model.layers.2": "disk", "lm_head": "cpu"}
    cfg = TargetConfig(
        name_or_path="tiny-llama", tiny="llama", device_map=nested, offload_folder=str(tmp_path)
    )
    sharded, _ = load_target(cfg)
    assert (tmp_path / "tiny-llama" / "index.json").is_file()
    assert sharded.model.layers[1].mlp.up_proj.weight.device.type == "meta"
    enc = padded(tok, PROMPTS)
    f_whole, _ = target_features(whole, enc.input_ids, enc.attention_mask, [1, 2, 3, 4])
    f_sharded, _ = target_features(sharded, enc.input_ids, enc.attention_mask, [1, 2, 3, 4])
    torch.testing.assert_close(f_sharded, f_whole, atol=1e-6, rtol=0)


def test_a_mode_offloads_what_does_not_fit_max_memory(tmp_path, tokenizer):
    """A tied tiny Llama (the lm_head is the embedding, as in SmolLM2) within 13 MB of CPU memory:
    accelerate keeps the embedding and layer 0 in memory and sends the rest to disk."""
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "tied")
    tokenizer.save_pretrained(tmp_path / "tied")
    whole, _ = load_target(TargetConfig(name_or_path=str(tmp_path / "tied")))
    budget = dict(device_map="sequential", max_memory={"cpu": "13MB"}, offload_folder=str(tmp_path / "off"))
    sharded, _ = load_target(TargetConfig(name_or_path=str(tmp_path / "tied"), **budget))
    placed = sharded.hf_device_map
    assert placed["model.embed_tokens"] == placed["lm_head"] == "cpu" and placed["model.layers.3"] == "disk"
    assert fingerprint(sharded, tokenizer) == fingerprint(whole, tokenizer)  # the last layer read from disk
    enc = padded(tokenizer, PROMPTS)
    f_whole, lg_whole = target_features(whole, enc.input_ids, enc.attention_mask, [1, 2, 3, 4], True)
    f_sharded, lg_sharded = target_features(sharded, enc.input_ids, enc.attention_mask, [1, 2, 3, 4], True)
    torch.testing.assert_close(f_sharded, f_whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(lg_sharded, lg_whole, atol=1e-6, rtol=0)
    gen = SpeculativeGenerator(sharded, None, tokenizer, DecodeConfig(lookup=True, cost_aware=False))
    ids = tokenizer(PROMPTS[2], return_tensors="pt").input_ids
    ref = whole.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    assert gen.generate(ids, max_new_tokens=NEW).tolist() == ref.tolist()


def test_features_command_with_a_device_map_writes_the_same_cache(tmp_path):
    placement = ",".join(f"{k}:{v}" for k, v in DISK_MAP.items())
    caches = {}
    for name, extra in (
        ("whole", []),
        ("sharded", [f"target.device_map={{{placement}}}", f"target.offload_folder={tmp_path / 'off'}"]),
    ):
        out = tmp_path / name
        args = parse(
            [
                "features",
                "target=tiny-llama",
                "draft=eagle3",
                "data.path=embedded:humaneval",
                "data.max_rows=3",
                "data.features.dtype=float32",
                f"data.features.out_dir={out}",
                *extra,
            ]
        ).args
        commands.features(args)
        caches[name] = FeatureCache(out, layers=[1, 2, 3, 4])
    assert len(caches["whole"]) == len(caches["sharded"]) == 3
    for i in range(3):
        torch.testing.assert_close(
            caches["sharded"][i]["features"], caches["whole"][i]["features"], atol=1e-6, rtol=0
        )


def test_placement_read_from_the_command_line():
    args = parse(
        [
            "features",
            "target=tiny-llama",
            "target.device_map=auto",
            "target.max_memory={0:70GiB,cpu:20GB}",
            "target.offload_folder=/tmp/off",
        ]
    ).args
    assert args.target.max_memory == {"cuda:0": "70GiB", "cpu": "20GB"}
    args = parse(["features", "target=tiny-llama", "target.device_map={model.layers.0:1,lm_head:cpu}"]).args
    assert args.target.device_map == {"model.layers.0": "cuda:1", "lm_head": "cpu"}


MISSING = f"cuda:{max(3, torch.cuda.device_count())}"
REFUSED = [
    (
        dict(device_map={**DISK_MAP, "model.layers.3": MISSING}),
        f"puts model.layers.3 on {MISSING}, but this machine has",
    ),
    (
        dict(device_map={k: v for k, v in DISK_MAP.items() if k not in ("model.layers.2", "model.norm")}),
        "leaves model.layers.2, model.norm on no device",
    ),
    (
        dict(device_map={**DISK_MAP, "model.layer.9": "cpu"}),
        "names model.layer.9, which the target does not have",
    ),
    (dict(device_map="sequential", max_memory={"cpu": "1KiB"}), "fits none of the target's modules"),
    (dict(device_map="auto", max_memory={MISSING: "1GiB"}), f"budgets {MISSING}, but this machine has"),
    (dict(device_map={**DISK_MAP, "lm_head": "disk"}), "offloads lm_head to disk; drafters share"),
    (dict(device_map={"model": "cpu", "lm_head": "disk"}, offload_folder=None), "set target.offload_folder"),
    (dict(device_map="everywhere"), "target.device_map=everywhere is unknown"),
    (dict(device_map=3), "target.device_map=3 is unknown"),
    (dict(device_map="auto", max_memory="1GiB"), "is not a budget; give sizes per device"),
    (dict(device_map={"model": "cpu", "lm_head": "gpu"}), "{lm_head: gpu}, which is not a device"),
    (dict(device_map="auto", max_memory={"cpu": "20"}), "write it like 20GiB"),
    (
        dict(max_memory={"cpu": "1GiB"}, offload_folder=None),
        "target.max_memory is a budget for target.device_map",
    ),
    (dict(offload_folder="off"), "target.offload_folder holds weights that target.device_map puts on disk"),
    (dict(device_map={**DISK_MAP}, max_memory={"cpu": "1GiB"}), "drop target.max_memory"),
]


@pytest.mark.parametrize("placement, message", REFUSED)
def test_bad_placements_are_refused_in_one_line_before_loading(
    saved, tmp_path, monkeypatch, placement, message
):
    def never(*args, **kwargs):
        raise AssertionError("the target's weights were read")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", never)
    kw = {"offload_folder": str(tmp_path), **placement}
    with pytest.raises(UserError) as e:
        load_target(TargetConfig(name_or_path=saved, **kw))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not any(tmp_path.iterdir())  # nothing offloaded
