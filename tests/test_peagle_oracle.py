"""speculators' ``PEagleDraftModel`` as an oracle for P-EAGLE, on the tiny Llama target.

On the same weights (a speculator saved by speculators and imported here), the same inputs and
the same sampled (anchor, depth) entries (ours injected into its forward), our group pass gives
its logits, our objective its loss and every parameter its gradient, to 1e-5: plain and packed
rows, a reduced and the full vocabulary, the EAGLE-3 norm variants, a shared or own embedding.
Our conditional-drop sampling keeps the oracle's number of anchors per depth (exactly, where
that is deterministic) and the same per-anchor frequencies. Our speculators export loads in
``PEagleDraftModel.from_pretrained`` with no missing or unexpected key and the same logits, and
imports back to the same tensors. Skipped, with the reason, without ``speculators``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema.heads import DraftConfig
from draftheads.heads.peagle import DropSampling, PEagleDrafter, conditional_drop, group_entries
from draftheads.heads.peagle.convert import load_speculators, write_speculators
from draftheads.train.modules.peagle import PEagleObjective, counted_depths

LAYERS, MASK, DEPTHS, T = [1, 2, 3], 7, 4, 17  # tiny-llama has 4 layers: feature layers 1..3
VOCAB_IDS = torch.arange(0, 3000, 10)  # the reduced draft vocabulary (300 ids)


def speculators_classes():
    pytest.importorskip(
        "speculators", reason="speculators is not installed (see the interop extra in pyproject.toml)"
    )
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return (
        SpeculatorsConfig,
        VerifierConfig,
        PEagleDraftModel,
        PEagleSpeculatorConfig,
        GreedyTokenProposalConfig,
    )


def share_verifier(spec, model) -> None:
    """What speculators' ``load_verifier_weights`` gives it: the target's embedding and lm_head
    (its draft-vocabulary rows), and the target's head as the teacher. The teacher reads the
    target's final *normed* state here, so its ``verifier_norm`` is the identity."""
    head = model.get_output_embeddings().weight
    rows = head[spec.t2d] if spec.use_draft_vocab else head
    spec.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight)
    spec.lm_head.weight.data.copy_(rows)
    spec.verifier_lm_head.weight.data.copy_(rows)
    spec.verifier_norm = nn.Identity()


def oracle(model, fp, vocab: int = 300, own: bool = False, seed: int = 2, **flags):
    """A random-weight ``PEagleDraftModel`` for the tiny target, every trained tensor moved off
    its start (the mask token's embedding row, or with ``own`` the whole embedding, included)."""
    sc, vc, model_cls, config_cls, greedy = speculators_classes()
    from transformers import LlamaConfig

    layers = LlamaConfig(**{**model.config.to_dict(), "num_hidden_layers": 1})
    layers._attn_implementation = "eager"
    config = config_cls(
        transformer_layer_config=layers,
        draft_vocab_size=vocab,
        eagle_aux_hidden_state_layer_ids=LAYERS,
        mask_token_id=MASK,
        speculators_config=sc(
            algorithm="peagle",
            proposal_methods=[greedy(speculative_tokens=DEPTHS)],
            default_proposal_method="greedy",
            verifier=vc(name_or_path=fp.name, architectures=[fp.architecture]),
        ),
        **flags,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        spec = model_cls(config)
    if vocab < fp.vocab_size:
        t2d = torch.zeros(fp.vocab_size, dtype=torch.bool)
        t2d[VOCAB_IDS] = True
        spec.load_vocab_mappings(t2d, VOCAB_IDS - torch.arange(vocab))
    share_verifier(spec, model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in spec.named_parameters():
            if not name.startswith(("embed_tokens", "verifier_", "mask_hidden")):
                p.add_(torch.randn(p.shape, generator=g) * (0.3 if "norm" in name else 0.05))
        emb = spec.embed_tokens.weight
        if own:
            emb.add_(torch.randn(emb.shape, generator=g) * 0.05)
        else:
            emb[MASK] += torch.randn(emb.shape[1], generator=g)
    for name, p in spec.named_parameters():
        p.requires_grad_(not name.startswith("verifier_"))
    return spec


def imported(tmp_path, spec, model, tok) -> PEagleDrafter:
    """The oracle as speculators saves it, imported by draftheads."""
    spec.save_pretrained(str(tmp_path / "spec"))
    return load_speculators(tmp_path / "spec", model, tok)


def rows(packed: bool) -> dict[str, torch.Tensor]:
    """A training row of T tokens: answers from position 3 (two documents when ``packed``)."""
    ids = (torch.arange(3, 3 + T)[None] * 13) % 280 + 10  # avoids the pad (2) and mask (7) tokens
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :3] = 0
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
    if packed:
        batch["position_ids"] = torch.cat([torch.arange(8), torch.arange(T - 8)])[None]
        loss_mask[:, 8:10] = 0
    return batch


def entries(batch: dict, seed: int = 0):
    counted = counted_depths(batch["loss_mask"], DEPTHS, T - 1, batch.get("position_ids"))
    chosen = conditional_drop(counted, DropSampling(ratio=0.8), torch.Generator().manual_seed(seed))
    return group_entries(chosen)


def objective(drafter, model) -> PEagleObjective:
    cfg = DraftConfig.of(
        kind="eagle", version=3, feature_layers=LAYERS, draft_vocab_size=drafter.draft_vocab_size
    )
    return PEagleObjective(drafter, model, cfg, topk=1)


def their_pass(
    spec, obj: PEagleObjective, batch: dict, found, monkeypatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' training forward on ``batch`` with our entries ``found`` injected as its
    sampled indices: (its logits per entry, its loss). Its batch is speculators' shifted one of
    the target states our objective reads (packed rows: per document): features f_0..f_{R-1},
    tokens x_1..x_R, teacher states at 1..R, and the loss mask of each row's depth-0 prediction
    (ours, so both count the same entries)."""
    import speculators.models.peagle.core as core
    from speculators.losses import resolve_loss_config

    anchor, depth, keep = (x[0][found[2][0]] for x in found)
    monkeypatch.setattr(core, "generate_cod_sample_indices", lambda **kw: (anchor, depth))
    ids, pos = batch["input_ids"], batch.get("position_ids")
    with torch.no_grad():
        feats, final = obj.split(obj.features(batch))
    docs = (
        torch.zeros(1, T - 1, dtype=torch.long) if pos is None else (pos == 0).long().cumsum(-1)[:, : T - 1]
    )
    seen: list[torch.Tensor] = []
    hook = spec.lm_head.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        _, loss, _ = spec(
            hidden_states=feats[:, : T - 1],
            input_ids=ids[:, 1:],
            document_ids=docs,
            loss_mask=counted_depths(batch["loss_mask"], 1, T - 1, pos)[0].float(),
            verifier_last_hidden_states=final[:, 1:],
            num_depths=DEPTHS,
            loss_config=resolve_loss_config("kl_div", "eager"),  # its default, without Triton
        )
    finally:
        hook.remove()
    return seen[0][0], loss


def our_logits(d: PEagleDrafter, obj: PEagleObjective, batch: dict, found) -> torch.Tensor:
    x = obj.inputs(batch)
    out = d.group(x["features"], x["next_ids"], x["positions"], x["docs"], *found)
    return d.logits(out)[0][found[2][0]]


CASES = [
    dict(),
    dict(packed=True),
    dict(vocab=None),
    dict(own=True),
    dict(norm_before_residual=True, norm_before_fc=True, norm_output=True),
    dict(fc_norm=True, packed=True),
]
NAMES = ["plain", "packed", "full_vocab", "own_embedding", "trainer_norms", "fc_norm_packed"]


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_group_logits_loss_and_gradients_equal_speculators(tmp_path, tiny_llama, monkeypatch, case):
    model, tok, fp = tiny_llama
    case = dict(case)
    packed, vocab = case.pop("packed", False), case.pop("vocab", 300) or fp.vocab_size
    spec = oracle(model, fp, vocab=vocab, **case)
    d = imported(tmp_path, spec, model, tok)
    assert d.own_embedding == case.get("own", False) and d.num_depths == DEPTHS
    batch = rows(packed)
    found = entries(batch)
    assert int(found[1].max()) == DEPTHS - 1  # every depth is exercised
    obj = objective(d, model)
    theirs, their_loss = their_pass(spec, obj, batch, found, monkeypatch)
    ours = our_logits(d, obj, batch, found)
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)
    our_loss, _ = obj.loss(batch, found)
    assert torch.allclose(our_loss, their_loss, atol=1e-5), (our_loss, their_loss)
    our_loss.backward()
    their_loss.backward()
    assert_same_gradients(d, spec)


def assert_same_gradients(d: PEagleDrafter, spec) -> None:
    """Every trained tensor's gradient equals the oracle's under its speculators name (the mask
    token's embedding row: ours is ``mask_embed`` unless the drafter owns the table)."""
    theirs = {k: p.grad for k, p in spec.named_parameters() if p.grad is not None}
    names = {"hidden_norm.weight": "layers.0.hidden_norm.weight", "mask_embed": "embed_tokens.weight"}
    checked = 0
    for name, p in d.named_parameters():
        want = theirs[names.get(name, name)]
        if name == "mask_embed":
            want = want[MASK]
        assert p.grad is not None and torch.allclose(p.grad, want, atol=1e-5), name
        checked += int(bool(p.grad.abs().sum() > 0))
    assert checked == len(list(d.parameters()))  # and none of them is trivially zero


# ---- conditional-drop sampling against speculators' generate_cod_sample_indices ----------------
def their_counts(counted0: torch.Tensor, seed: int, **kw) -> tuple[list[int], torch.Tensor]:
    """speculators' sampler on a row whose depth-0 mask is ``counted0 [R]``: entries per depth,
    and ``[DEPTHS, R]`` the anchors it chose (anchor = index - depth)."""
    speculators_classes()
    from speculators.models.peagle.data import generate_cod_sample_indices

    torch.manual_seed(seed)
    anchor, depth = generate_cod_sample_indices(
        counted0.numel(), counted0[None].float(), num_depths=DEPTHS, **kw
    )
    chosen = torch.zeros(DEPTHS, counted0.numel(), dtype=torch.bool)
    chosen[depth, anchor] = True
    return torch.bincount(depth, minlength=DEPTHS).tolist(), chosen


def spans(R: int = 120) -> torch.Tensor:
    """A [1, R + 2] loss mask of answers of 1 to 4 tokens between prompts: chains end early,
    so deep pools are often smaller than the sizes (the random part of the schedule)."""
    g = torch.Generator().manual_seed(5)
    mask, t = torch.zeros(1, R + 2, dtype=torch.long), 3
    while t < R + 2:
        n = int(torch.randint(1, 5, (1,), generator=g))
        mask[0, t : t + n] = 1
        t += n + int(torch.randint(1, 4, (1,), generator=g))
    return mask


@pytest.mark.parametrize("max_anchors", [None, 40])
def test_sampling_keeps_the_oracles_number_of_anchors_per_depth(max_anchors):
    """A row answered throughout: pools exceed sizes, so both keep exactly floor(...) per depth."""
    loss_mask = torch.ones(1, 122, dtype=torch.long)
    loss_mask[:, :3] = 0
    counted = counted_depths(loss_mask, DEPTHS, 120)
    sampling = DropSampling(ratio=0.7, ratio_min=0.2, max_anchors=max_anchors)
    for seed in range(3):
        ours = conditional_drop(counted, sampling, torch.Generator().manual_seed(seed))
        want, _ = their_counts(counted[0, 0], seed, max_anchors=max_anchors)
        assert ours.sum((1, 2)).tolist() == want
        assert want[1] > want[2] > want[3]  # fewer anchors at deeper positions


def test_sampling_matches_the_oracles_statistics_where_pools_run_short():
    """Answer spans of 1..4 tokens: mean anchors per depth and each anchor's frequency at each
    depth, over 300 draws of each sampler (fixed seeds), agree; ours never breaks a chain."""
    loss_mask = spans()
    counted = counted_depths(loss_mask, DEPTHS, 120)
    ours_freq = torch.zeros(DEPTHS, 120)
    theirs_freq = torch.zeros(DEPTHS, 120)
    ours_n, theirs_n, deepest = torch.zeros(DEPTHS), torch.zeros(DEPTHS), set()
    draws = 300
    for seed in range(draws):
        chosen = conditional_drop(counted, DropSampling(), torch.Generator().manual_seed(seed))[:, 0]
        assert bool((chosen[2:] <= chosen[1:-1]).all()) and bool((chosen[1:] <= counted[1:, 0]).all())
        n, theirs = their_counts(counted[0, 0], seed)
        ours_freq += chosen.float()
        theirs_freq += theirs.float()
        ours_n += chosen.sum(1)
        deepest.add(int(chosen[-1].sum()))
        theirs_n += torch.tensor(n, dtype=torch.float)
    assert torch.allclose(ours_n / draws, theirs_n / draws, rtol=0.03), (ours_n / draws, theirs_n / draws)
    assert float((ours_freq - theirs_freq).abs().max()) / draws < 0.15
    means = (ours_n / draws).tolist()
    assert means[0] > means[1] > means[2] > means[3] and len(deepest) > 3  # the pools did run short


# ---- the speculators layout, both ways --------------------------------------------------------
def saved_target(folder, model, tok):
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "case", [dict(), dict(own=True), dict(vocab=None, fc_norm=True)], ids=["shared", "own", "full"]
)
def test_our_export_loads_in_peagle_draft_model_with_no_missing_keys(tmp_path, tiny_llama, monkeypatch, case):
    model, tok, fp = tiny_llama
    case = dict(case)
    vocab = case.pop("vocab", 300) or fp.vocab_size
    verifier = saved_target(tmp_path / "models" / "tiny-llama", model, tok)  # sets its config's architectures
    d = imported(tmp_path, oracle(model, fp, vocab=vocab, seed=4, **case), model, tok)
    out = write_speculators(d, tmp_path / "out", verifier=str(verifier))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "peagle" and cfg["mask_token_id"] == MASK
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == DEPTHS
    _, _, model_cls, _, _ = speculators_classes()
    from speculators.models.eagle3.core import Eagle3DraftModel

    theirs = model_cls.from_pretrained(str(out))  # its loader, which resolves the layers on the verifier
    assert theirs.config.eagle_aux_hidden_state_layer_ids == LAYERS
    # the same load with its report (its own override drops output_loading_info's tuple)
    _, info = super(Eagle3DraftModel, model_cls).from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    sd = load_file(str(out / "model.safetensors"))
    assert set(sd) == set(theirs.state_dict()) - {"verifier_lm_head.weight", "verifier_norm.weight"}
    from speculators.models.attention import create_float_mask

    theirs.config.transformer_layer_config._attn_implementation = "eager"  # dense masks on a CPU
    theirs._create_mask_fn = create_float_mask
    share_verifier_head(theirs, model)
    batch = rows(packed=False)
    found = entries(batch, seed=3)
    obj = objective(d, model)
    want, _ = their_pass(theirs, obj, batch, found, monkeypatch)
    assert torch.allclose(our_logits(d, obj, batch, found), want, atol=1e-5)
    back = load_speculators(out, model, tok)
    assert back.spec() == d.spec()
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())


def share_verifier_head(spec, model) -> None:
    """The teacher only (the drafter's own embedding and head came from the file)."""
    head = model.get_output_embeddings().weight
    spec.verifier_lm_head.weight.data.copy_(head[spec.t2d] if spec.use_draft_vocab else head)
    spec.verifier_norm = nn.Identity()


def test_a_speculator_with_a_bad_mask_token_is_refused_in_one_line(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    spec = oracle(model, fp)
    spec.save_pretrained(str(tmp_path / "spec"))
    path = tmp_path / "spec" / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({**cfg, "mask_token_id": fp.vocab_size}))
    with pytest.raises(UserError, match="mask_token_id=49152 is not a token id of the target") as err:
        load_speculators(tmp_path / "spec", model, tok)
    assert "\n" not in str(err.value)


def test_a_speculator_without_its_input_norm_loads_it_as_speculators_does(tmp_path, tiny_llama, capsys):
    """``input_norm.weight`` is optional on speculators' load (left at ones): imported the same way."""
    from safetensors.torch import save_file

    model, tok, fp = tiny_llama
    oracle(model, fp, norm_before_fc=True).save_pretrained(str(tmp_path / "spec"))
    path = tmp_path / "spec" / "model.safetensors"
    save_file({k: v for k, v in load_file(str(path)).items() if k != "input_norm.weight"}, str(path))
    capsys.readouterr()
    ours = load_speculators(tmp_path / "spec", model, tok)
    assert "holds no input_norm.weight" in capsys.readouterr().err
    assert torch.equal(ours.input_norm.weight, torch.ones(3 * fp.hidden_size))
