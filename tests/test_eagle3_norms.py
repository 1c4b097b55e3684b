"""EAGLE-3's norm variants (norm_before_residual, norm_before_fc, fc_norm, norm_output), which
speculators' trainer turns on: a speculator saved by speculators with each of them imports, runs
its training-time-test chain with the same logits as speculators' own ``Eagle3DraftModel.forward``
(to 1e-5), exports unchanged to the speculators and vLLM layouts, and trains as ``draft.*`` keys."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config
from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads import Drafter, EagleDrafter
from draftheads.heads.export import export_drafter
from draftheads.heads.speculators import EAGLE3_FLAGS
from draftheads.train.unroll import unroll
from tests.test_export import eagle
from tests.test_speculators_format import share_target

LENGTH, STEPS = 9, 3
VARIANTS = [
    {"norm_before_residual": True},
    {"norm_before_fc": True},
    {"fc_norm": True},
    {"norm_output": True},
    {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},  # speculators' trainer
]
IDS = ["residual", "before_fc", "fc_norm", "output", "trainer_defaults"]


def saved_by_speculators(
    out,
    model,
    fp,
    flags: dict[str, bool],
    layer_settings: dict | None = None,
    seed: int = 2,
    norm_noise: float = 0.3,
):
    """A random-weight EAGLE-3 speculator with ``flags`` (and ``layer_settings`` in its layer
    config), built and saved by speculators itself: every weight moved by N(0, 0.05), every norm's
    gain by N(0, ``norm_noise``) so that each norm shows."""
    pytest.importorskip(
        "speculators", reason="speculators is not installed (see the interop extra in pyproject.toml)"
    )
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layers = LlamaConfig(**{**model.config.to_dict(), "num_hidden_layers": 1, **(layer_settings or {})})
    layers._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layers,
        draft_vocab_size=300,
        eagle_aux_hidden_state_layer_ids=[1, 2, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=fp.name, architectures=[fp.architecture]),
        ),
        **flags,
    )
    spec = Eagle3DraftModel(config)
    ids = torch.arange(0, 3000, 10)
    t2d = torch.zeros(fp.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    spec.load_vocab_mappings(t2d, ids - torch.arange(300))
    share_target(spec, model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in spec.named_parameters():
            if not name.startswith(("embed_tokens", "verifier_")):
                p.copy_(p + torch.randn(p.shape, generator=g) * (norm_noise if "norm" in name else 0.05))
    spec.eval().save_pretrained(str(out))
    return spec


@torch.no_grad()
def their_chain(spec, model, ids: torch.Tensor) -> list[torch.Tensor]:
    """speculators' ``Eagle3DraftModel.forward`` over ``ids``: the draft logits of each of its
    training-time-test steps (its lm_head's outputs), at positions 0.. of the features."""
    hidden = model(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hidden[i] for i in spec.config.eagle_aux_hidden_state_layer_ids], -1)[:, :LENGTH]
    seen: list[torch.Tensor] = []
    hook = spec.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        spec(
            hidden_states=feats,
            input_ids=ids[:, 1 : LENGTH + 1],
            document_ids=torch.zeros(1, LENGTH, dtype=torch.long),
            position_ids=torch.arange(LENGTH)[None],
            ttt_steps=STEPS,
        )
    finally:
        hook.remove()
    return seen


@torch.no_grad()
def our_chain(d: EagleDrafter, model, ids: torch.Tensor) -> list[torch.Tensor]:
    """The same steps as draftheads trains and drafts them (:func:`unroll`)."""
    hidden = model(ids, output_hidden_states=True).hidden_states
    outs = unroll(d, d.select_features(hidden)[:, :LENGTH], ids[:, : LENGTH + 1], STEPS)
    return [d.logits(o) for o in outs]


def chain_ids() -> torch.Tensor:
    return (torch.arange(4, 4 + LENGTH + 1)[None] * 13) % 280


def assert_same_chain(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    assert len(ours) == len(theirs) == STEPS
    for s, (a, b) in enumerate(zip(ours, theirs)):
        rows = LENGTH - s  # speculators pads the last s rows' tokens with 0: those rows are not a chain
        assert torch.allclose(a[:, :rows], b[:, :rows], atol=1e-5), f"step {s}"


@pytest.mark.parametrize("flags", VARIANTS, ids=IDS)
def test_a_speculator_with_norm_variants_imports_with_speculators_own_logits(tmp_path, tiny_llama, flags):
    model, tok, fp = tiny_llama
    spec = saved_by_speculators(tmp_path / "spec", model, fp, flags)
    ours = Drafter.from_pretrained(tmp_path / "spec", target=model, tokenizer=tok).eval()
    assert ours.norm_flags == {f: bool(flags.get(f)) for f in EAGLE3_FLAGS}
    assert_same_chain(our_chain(ours, model, chain_ids()), their_chain(spec, model, chain_ids()))


def without(flags: dict[str, bool], name: str) -> dict[str, bool]:
    return {k: v for k, v in flags.items() if k != name}


@pytest.mark.parametrize("flags", VARIANTS[:4], ids=IDS[:4])
def test_each_norm_variant_changes_the_chain(tmp_path, tiny_llama, flags):
    """Each flag matters on these weights: read without it, the same tensors draft otherwise
    (so the comparison above would catch a variant the drafter ignored)."""
    model, tok, fp = tiny_llama
    saved_by_speculators(tmp_path / "spec", model, fp, flags)
    ours = Drafter.from_pretrained(tmp_path / "spec", target=model, tokenizer=tok).eval()
    name = next(iter(flags))
    plain = EagleDrafter(
        fp,
        target_config=ours.spec()["target_config"],
        version=3,
        feature_layers=[1, 2, 3],
        draft_vocab_size=300,
        **without(flags, name),
    ).attach(model)
    state = {k: v for k, v in ours.state_dict().items() if not k.startswith(("input_norm", "fc_norm"))}
    plain.load_state_dict(state)
    theirs, mine = our_chain(ours, model, chain_ids()), our_chain(plain.eval(), model, chain_ids())
    assert not torch.allclose(theirs[-1], mine[-1], atol=1e-3)


@pytest.mark.parametrize("flags", VARIANTS, ids=IDS)
def test_norm_variants_export_unchanged_and_import_back(tmp_path, tiny_llama, flags):
    """speculators and vLLM layouts carry the flags and their norms' tensors as they came; both
    import back with the same chain, and SGLang, never checked for them, is refused in one line."""
    model, tok, fp = tiny_llama
    spec = saved_by_speculators(tmp_path / "spec", model, fp, flags)
    ours = Drafter.from_pretrained(tmp_path / "spec", target=model, tokenizer=tok).eval()
    given = json.loads((tmp_path / "spec" / "config.json").read_text())
    theirs_sd = load_file(str(tmp_path / "spec" / "model.safetensors"))
    out = export_drafter(ours, "speculators", tmp_path / "again")
    written = json.loads((out / "config.json").read_text())
    assert {f: written[f] for f in EAGLE3_FLAGS} == {f: given[f] for f in EAGLE3_FLAGS}
    sd = load_file(str(out / "model.safetensors"))
    norms = [k for k in theirs_sd if k.startswith(("input_norm", "fc_norm"))]
    assert norms == [k for k in sd if k.startswith(("input_norm", "fc_norm"))]
    assert all(torch.equal(sd[k], theirs_sd[k]) for k in norms)
    vllm = export_drafter(ours, "vllm", tmp_path / "vllm")
    vllm_cfg = json.loads((vllm / "config.json").read_text())
    assert {f: vllm_cfg[f] for f in EAGLE3_FLAGS} == {f: bool(flags.get(f)) for f in EAGLE3_FLAGS}
    expected = their_chain(spec, model, chain_ids())
    for folder in (out, vllm):
        back = Drafter.from_pretrained(folder, target=model, tokenizer=tok).eval()
        assert_same_chain(our_chain(back, model, chain_ids()), expected)
    with pytest.raises(UserError, match="SGLang's EAGLE-3 loader is not known to read") as err:
        export_drafter(ours, "sglang", tmp_path / "sglang")
    assert "\n" not in str(err.value)


def test_a_speculator_without_its_input_norm_loads_it_as_speculators_does(tmp_path, tiny_llama, capsys):
    """speculators lists ``input_norm.weight`` as optional on load and leaves that norm at ones: a
    file without it imports with speculators' logits for those weights, and one stderr line says so."""
    from safetensors.torch import save_file

    model, tok, fp = tiny_llama
    spec = saved_by_speculators(tmp_path / "spec", model, fp, {"norm_before_fc": True})
    path = tmp_path / "spec" / "model.safetensors"
    save_file({k: v for k, v in load_file(str(path)).items() if k != "input_norm.weight"}, str(path))
    spec.input_norm.weight.data.fill_(1.0)  # what speculators' loader leaves there
    capsys.readouterr()
    ours = Drafter.from_pretrained(tmp_path / "spec", target=model, tokenizer=tok).eval()
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and "holds no input_norm.weight" in note[0] and "(ones)" in note[0], note
    assert torch.equal(ours.input_norm.weight, torch.ones(3 * fp.hidden_size))
    assert_same_chain(our_chain(ours, model, chain_ids()), their_chain(spec, model, chain_ids()))


def test_norm_variants_are_draft_keys_that_train(tmp_path, tiny_llama):
    """draft.* keys build the drafter with the variants, every norm gets a gradient from the
    training objective, and the checkpoint keeps them."""
    from draftheads.train.drafters import build_drafter, build_objective

    model, tok, _ = tiny_llama
    draft = DraftConfig.of(
        kind="eagle", version=3, draft_vocab_size=300, feature_layers=[1, 2, 3], ttt_steps=2,
        norm_before_residual=True, fc_norm=True, norm_output=True,
    )  # fmt: skip
    d = build_drafter(Config(draft=draft), model, tok)
    assert d.norm_flags == {
        "norm_before_residual": True,
        "norm_before_fc": False,
        "fc_norm": True,
        "norm_output": True,
    }
    objective = build_objective(d, model, draft, topk=1)
    ids = chain_ids().repeat(2, 1)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    loss = objective(batch)
    loss = loss[0] if isinstance(loss, tuple) else loss
    loss.backward()
    for name in ("fc_norm.0.weight", "fc_norm.2.weight", "norm.weight", "hidden_norm.weight"):
        grad = dict(d.named_parameters())[name].grad
        assert grad is not None and bool(grad.abs().sum() > 0), name
    d.save_pretrained(tmp_path / "d")
    spec = json.loads((tmp_path / "d" / "config.json").read_text())["spec"]
    assert spec["fc_norm"] is True and "norm_before_fc" not in spec
    assert Drafter.from_pretrained(tmp_path / "d").norm_flags == d.norm_flags


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(version=1, norm_output=True), "draft.eagle.norm_output=true is an EAGLE-3 variant"),
        (dict(version=3, norm_before_fc=True, fc_norm=True), "they are alternatives"),
    ],
)
def test_impossible_norm_variants_are_refused_in_one_line(tiny_llama, kw, match):
    model, _, fp = tiny_llama
    with pytest.raises(UserError, match=match) as err:
        eagle(model, fp, **kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("tree", ["auto", "[[0],[0,0],[0,0,0]]"])
def test_a_drafter_with_every_norm_variant_decodes_the_targets_greedy_output(tiny_llama, tree):
    """The decoder (an EAGLE-2 dynamic tree, and a chain) with the variants on: the target's own
    greedy continuation, drafting through the variants' arithmetic."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator

    model, tok, fp = tiny_llama
    d = eagle(model, fp, 3, norm_before_residual=True, norm_before_fc=True, norm_output=True).eval()
    ids = tok("Once upon a time, there was a little", return_tensors="pt").input_ids
    want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(tree=tree))
    out = gen.generate(ids, torch.ones_like(ids), max_new_tokens=16)
    assert out[0].tolist() == want[0].tolist()
    assert gen.last_stats.new_tokens == 16
