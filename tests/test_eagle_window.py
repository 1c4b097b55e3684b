"""A speculators EAGLE-3 whose draft layer slides (``sliding_window``, ``use_sliding_window`` and
``layer_types: ["sliding_attention"]`` in its ``transformer_layer_config``, as speculators' trainer
writes them) keeps its window: imported into the drafter's layer config, computed as speculators'
own forward computes it past the window, written again by every export that can serve it, and
decoded with it (the decoder's cached drafter equals the training unroll, both by position)."""

from __future__ import annotations

import json

import pytest
import torch

from draftheads.conf.errors import UserError
from draftheads.heads import Drafter, EagleDrafter
from draftheads.heads.export import export_drafter
from tests.conftest import get_target
from tests.test_drafter_equivalence import ARCH
from tests.test_eagle3_norms import saved_by_speculators

WINDOW, LENGTH = 4, 12  # the window, and positions 0..11: most of them see past it
SETTINGS = {"sliding_window": WINDOW, "use_sliding_window": True, "layer_types": ["sliding_attention"]}


def windowed_speculator(out, model, fp):
    """A random-weight EAGLE-3 speculator with a sliding draft layer, built and saved by speculators."""
    return saved_by_speculators(out, model, fp, {}, SETTINGS, seed=5, norm_noise=0.05)


def sequence() -> torch.Tensor:
    return (torch.arange(3, 3 + LENGTH + 1)[None] * 17) % 280


@torch.no_grad()
def their_logits(spec, model) -> torch.Tensor:
    """speculators' ``Eagle3DraftModel.forward`` (one step) over positions 0..LENGTH-1: its lm_head's output."""
    ids = sequence()
    hidden = model(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hidden[i] for i in spec.config.eagle_aux_hidden_state_layer_ids], -1)[:, :LENGTH]
    seen: list[torch.Tensor] = []
    hook = spec.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        spec(
            hidden_states=feats,
            input_ids=ids[:, 1:],
            document_ids=torch.zeros(1, LENGTH, dtype=torch.long),
            position_ids=torch.arange(LENGTH)[None],
            ttt_steps=1,
        )
    finally:
        hook.remove()
    return seen[0]


@torch.no_grad()
def our_logits(d: EagleDrafter, model) -> torch.Tensor:
    """Our drafter over the same pairs, in one pass with no cache."""
    ids = sequence()
    hidden = model(ids, output_hidden_states=True).hidden_states
    feats = d.fuse(d.select_features(hidden)[:, :LENGTH])
    return d.logits(d(ids[:, 1:], feats, torch.arange(LENGTH)[None]))


def imported(tmp_path, tiny_llama) -> tuple[EagleDrafter, object]:
    model, tok, fp = tiny_llama
    spec = windowed_speculator(tmp_path / "spec", model, fp)
    return Drafter.from_pretrained(tmp_path / "spec", target=model, tokenizer=tok).eval(), spec


def test_the_window_is_imported_and_computes_as_speculators_forward(tmp_path, tiny_llama):
    model, _, fp = tiny_llama
    ours, spec = imported(tmp_path, tiny_llama)
    assert {k: ours.layer_config_dict()[k] for k in SETTINGS} == SETTINGS and ours.window_layers == [0]
    theirs = our_logits(ours, model)
    assert torch.allclose(theirs, their_logits(spec, model), atol=1e-5)
    # the window matters: the same weights attending fully agree before it and differ past it
    full = {k: v for k, v in ours.spec().items() if k != "layer_config"}
    full["layer_config"] = {k: v for k, v in ours.layer_config_dict().items() if k not in SETTINGS}
    plain = EagleDrafter(fp, **full).attach(model)
    plain.load_state_dict(ours.state_dict())
    unwindowed = our_logits(plain.eval(), model)
    assert torch.allclose(unwindowed[:, :WINDOW], theirs[:, :WINDOW], atol=1e-5)
    assert (unwindowed[:, WINDOW:] - theirs[:, WINDOW:]).abs().amax(-1).min() > 1e-3


@torch.no_grad()
def test_a_cached_pass_past_the_window_equals_one_pass(tmp_path, tiny_llama):
    """Fed in three chunks through its own cache (the keys' positions kept there), the drafter
    computes what one pass over all positions does."""
    from transformers import DynamicCache

    from draftheads.heads.masks import additive_mask

    model, _, _ = tiny_llama
    ours, _ = imported(tmp_path, tiny_llama)
    ids = sequence()
    hidden = model(ids, output_hidden_states=True).hidden_states
    feats = ours.fuse(ours.select_features(hidden)[:, :LENGTH])
    cache, outs = DynamicCache(), []
    for start, end in ((0, 3), (3, 7), (7, LENGTH)):
        seen = torch.ones(end - start, end, dtype=torch.bool).tril(start)[None]
        pos = torch.arange(start, end)[None]
        out = ours(
            ids[:, 1 + start : 1 + end], feats[:, start:end], pos, additive_mask(seen, feats.dtype), cache
        )
        outs.append(ours.logits(out))
    assert torch.allclose(torch.cat(outs, 1), our_logits(ours, model), atol=1e-5)


def test_every_export_that_serves_the_window_writes_it_and_imports_back(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    ours, spec = imported(tmp_path, tiny_llama)
    expected = their_logits(spec, model)
    again = export_drafter(ours, "speculators", tmp_path / "again")
    layer = json.loads((again / "config.json").read_text())["transformer_layer_config"]
    assert {k: layer[k] for k in SETTINGS} == SETTINGS
    vllm = export_drafter(ours, "vllm", tmp_path / "vllm")
    assert {k: json.loads((vllm / "config.json").read_text())[k] for k in SETTINGS} == SETTINGS
    for folder in (again, vllm):
        back = Drafter.from_pretrained(folder, target=model, tokenizer=tok).eval()
        assert torch.allclose(our_logits(back, model), expected, atol=1e-5)
    with pytest.raises(UserError, match="SGLang's Llama draft layer attends fully") as err:
        export_drafter(ours, "sglang", tmp_path / "sglang")
    assert "\n" not in str(err.value) and not (tmp_path / "sglang").exists()


def test_a_drafter_without_a_window_writes_no_window_keys(tmp_path, tiny_llama):
    from tests.test_export import eagle

    model, _, fp = tiny_llama
    out = export_drafter(eagle(model, fp, 3, feature_layers=[1, 2, 3]), "speculators", tmp_path / "e3")
    layer = json.loads((out / "config.json").read_text())["transformer_layer_config"]
    assert not set(SETTINGS) & set(layer)


@pytest.mark.parametrize(
    "settings,match",
    [
        (
            {**SETTINGS, "layer_types": ["sliding_attention"] * 2},
            r"layer_types=\['sliding_attention', 'sliding_att",
        ),
        ({**SETTINGS, "layer_types": ["full_attention"]}, None),
    ],
    ids=["two-entries", "no-sliding-entry"],
)
def test_layer_types_that_do_not_fit_the_drafter_are_refused_or_ignored(
    tmp_path, tiny_llama, settings, match
):
    """layer_types of another length is refused in one line; without a sliding entry nothing slides."""
    model, tok, fp = tiny_llama
    ours, _ = imported(tmp_path, tiny_llama)
    given = {**ours.spec(), "layer_config": {**ours.layer_config_dict(), **settings}}
    if match is None:
        assert EagleDrafter(fp, **given).window_layers == []
        return
    with pytest.raises(UserError, match=match) as err:
        EagleDrafter(fp, **given)
    assert "\n" not in str(err.value)


def windowed_drafter(model, tok) -> EagleDrafter:
    """A random EAGLE-3 drafter for ``model`` whose layer slides, over a scattered draft vocabulary."""
    from draftheads.heads import fingerprint
    from draftheads.heads.draft_layers import llama_layers

    torch.manual_seed(3)
    layers = {**llama_layers(model.config.to_dict(), 1), **SETTINGS}
    fp = fingerprint(model, tok)
    d = EagleDrafter(fp, model.config.to_dict(), version=3, layer_config=layers, draft_vocab_size=2000)
    d.attach(model).set_vocab(torch.randperm(fp.vocab_size)[:2000])
    d.init_lm_head_from_target()
    assert d.window_layers == [0]
    return d


@pytest.mark.parametrize("tree", ["chain4", "auto"])
def test_a_windowed_drafter_decodes_as_it_trains(tree):
    """Every root and tree node the decoder drafts (its cache compacted per row, rows left-padded,
    one row leaving early; positions up to 3x past the window) equals the training unroll."""
    from tests.test_drafter_equivalence import decodes_as_it_trains

    model, tok = get_target(ARCH)
    decodes_as_it_trains(model, tok, windowed_drafter(model, tok), tree)


def test_a_peagle_speculator_keeps_its_window_both_ways(tmp_path, tiny_llama):
    """P-EAGLE's draft layer is EAGLE-3's: a window in its transformer_layer_config is imported
    and written again."""
    from draftheads.heads.peagle.convert import load_speculators, write_speculators
    from tests.test_peagle_oracle import oracle

    model, tok, fp = tiny_llama
    oracle(model, fp).save_pretrained(str(tmp_path / "spec"))
    path = tmp_path / "spec" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["transformer_layer_config"].update(SETTINGS)
    path.write_text(json.dumps(cfg))
    ours = load_speculators(tmp_path / "spec", model, tok)
    assert ours.window_layers == [0]
    again = json.loads((write_speculators(ours, tmp_path / "again") / "config.json").read_text())
    assert {k: again["transformer_layer_config"][k] for k in SETTINGS} == SETTINGS


def recording(generator: type) -> type:
    """``generator`` whose EAGLE proposer keeps every tree it drafts, at the full depth (no plan)."""
    from draftheads.decode.proposers import WithLookup

    class Recording(generator):
        def make_proposer(self):
            oracle = super().make_proposer()
            inner = oracle.inner.proposer if isinstance(oracle.inner, WithLookup) else oracle.inner
            self.trees, propose = [], inner.propose

            def keep(root, pos, plan=None):
                self.trees.append(propose(root, pos))
                return self.trees[-1]

            inner.propose = keep
            return oracle

    return Recording


def test_fixed_shape_drafting_keeps_the_window_on_static_buffers():
    """The drafter's cache moved into fixed-capacity buffers (``decode.backend=cuda-graphs``, here
    without capture) keeps its keys' positions: every tree equals the dynamic cache's."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode.static import StaticVerifier
    from tests.test_decode import PROMPTS, OracleGenerator, batch, reference
    from tests.test_static_cache import FixedDrafting

    model, tok = get_target(ARCH)
    d = windowed_drafter(model, tok)
    prompts = PROMPTS[:2]
    cont, plen = [reference(ARCH, p, 30) for p in prompts], [len(tok(p).input_ids) for p in prompts]
    cfg = DecodeConfig(tree="auto", cost_aware=False, lookup=False, depth=4, top_k_draft=3, total_tokens=10)
    enc, trees = batch(tok, prompts), []
    for kind in (FixedDrafting, OracleGenerator):
        gen = recording(kind)(model, d, tok, cfg, continuations=cont, prompt_lens=plen)
        if kind is FixedDrafting:
            gen.static_verifier = StaticVerifier(model, capture=False)
        gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=30)
        trees.append(gen.trees)
    assert len(trees[0]) == len(trees[1]) > 5
    for fixed, dynamic in zip(*trees):
        assert torch.equal(fixed.tokens, dynamic.tokens) and torch.allclose(
            fixed.scores, dynamic.scores, atol=1e-6
        )


def test_a_peagle_layer_types_of_another_length_is_one_line_from_python(tmp_path, tiny_llama):
    """``load_speculators`` reads the file without the folder checks of the command line: a
    layer_types longer than the layer count is still named in one line, not transformers' traceback."""
    from draftheads.heads.peagle.convert import load_speculators
    from tests.test_peagle_oracle import oracle

    model, tok, fp = tiny_llama
    oracle(model, fp).save_pretrained(str(tmp_path / "spec"))
    path = tmp_path / "spec" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["transformer_layer_config"].update(SETTINGS, layer_types=["sliding_attention"] * 2)
    path.write_text(json.dumps(cfg))
    with pytest.raises(
        UserError, match=r"must be equal to the number of `layer_types` \(2\)\); it is damaged"
    ) as e:
        load_speculators(tmp_path / "spec", model, tok)
    assert "\n" not in str(e.value)
