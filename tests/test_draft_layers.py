"""A drafter's own layers, sized from any target's config: the Llama shape the engines serve.

EAGLE drafters are Llama decoder layers whatever the target; their sizes come from the target's
config as speculators derives them (heads, head size, MLP width, rope, eps), a published drafter's
own sizes win, and drafters saved before the layers were recorded load (Llama-shaped targets) or
are refused in one line (any other)."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.heads import Drafter, EagleDrafter, fingerprint
from draftheads.heads.draft_layers import llama_layers, own_sizes
from tests.conftest import get_target


def test_sizes_follow_the_target_and_what_a_llama_mlp_can_run():
    gemma = {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "vocab_size": 262208,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
    }
    c = llama_layers(gemma, 1)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (8, 4, 256)
    assert c["hidden_act"] == "silu" and c["intermediate_size"] == 10240
    assert c["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}  # the sliding layers'


def test_moe_latent_attention_and_gpt2_names():
    deepseek = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "head_dim": 64,  # the rope part of MLA's heads
        "kv_lora_rank": 512,
        "vocab_size": 129280,
        "n_routed_experts": 256,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 40.0,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    }
    c = llama_layers(deepseek, 1)
    assert c["head_dim"] == 7168 // 128 and c["intermediate_size"] == 3 * 7168  # MoE, no dense width
    assert "partial_rotary_factor" not in c["rope_parameters"] and c["rope_parameters"]["rope_type"] == "yarn"
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 512}
    g = llama_layers(gpt2, 2)
    assert (
        g["hidden_size"],
        g["num_attention_heads"],
        g["intermediate_size"],
        g["max_position_embeddings"],
    ) == (
        64,
        4,
        256,
        512,
    )


def test_a_missing_size_is_named_in_one_line():
    with pytest.raises(UserError, match="has no num_attention_heads") as e:
        llama_layers({"model_type": "odd", "hidden_size": 64, "vocab_size": 10}, 1)
    assert "\n" not in str(e.value)


def test_published_sizes_win_over_the_targets():
    target = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}
    given = own_sizes({"intermediate_size": 96, "num_key_value_heads": 1, "rope_theta": 5e5, "vocab_size": 3})
    c = llama_layers(target, 1, given=given)
    assert (c["intermediate_size"], c["num_key_value_heads"], c["vocab_size"]) == (96, 1, 10)
    assert c["rope_parameters"] == {"rope_type": "default", "rope_theta": 5e5}


def saved_before_layer_config(tmp_path, arch: str):
    """An EAGLE-3 drafter for ``arch`` saved as drafters were before they recorded their layers."""
    model, tok = get_target(arch)
    torch.manual_seed(0)
    d = EagleDrafter(fingerprint(model, tok), target_config=model.config.to_dict(), version=3).attach(model)
    d.save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    del conf["spec"]["layer_config"]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    return d, model, tok


def test_a_drafter_saved_without_layer_config_loads_for_a_llama_target(tmp_path):
    d, model, tok = saved_before_layer_config(tmp_path, "llama")
    back = Drafter.from_pretrained(tmp_path, target=model, tokenizer=tok)
    assert back.layer_config_dict() == d.layer_config_dict()
    feats = torch.randn(1, 5, 3 * model.config.hidden_size)
    ids, pos = torch.randint(0, 100, (1, 5)), torch.arange(5)[None]
    with torch.no_grad():
        assert torch.equal(back(ids, back.fuse(feats), pos), d(ids, d.fuse(feats), pos))


def test_a_drafter_saved_with_another_layer_class_is_refused_in_one_line(tmp_path):
    _, model, tok = saved_before_layer_config(tmp_path, "qwen2")
    with pytest.raises(UserError, match="qwen2 decoder layers.*retrain it with draftheads train") as e:
        Drafter.from_pretrained(tmp_path, target=model, tokenizer=tok)
    assert "\n" not in str(e.value)


def test_init_from_target_copies_what_matches_and_refuses_a_target_with_nothing_to_copy():
    llama, tok = get_target("llama")
    d = EagleDrafter(fingerprint(llama, tok), target_config=llama.config.to_dict(), version=3).attach(llama)
    d.init_from_target(llama)
    last = llama.model.layers[-1]
    assert torch.equal(d.layers[0].mlp.down_proj.weight, last.mlp.down_proj.weight)
    gpt2, gtok = get_target("gpt2")
    e = EagleDrafter(fingerprint(gpt2, gtok), target_config=gpt2.config.to_dict(), version=3).attach(gpt2)
    with pytest.raises(
        UserError, match="GPT2Block shares no tensor.*draft.eagle.init_from_target=false"
    ) as err:
        e.init_from_target(gpt2)
    assert "\n" not in str(err.value)
