"""What CUDA graph capture needs, proven on CPU: the static step functions trace as one graph
with no host read in it, and a decoding step reads device values on the host at most twice.

``torch.compile(fullgraph=True, dynamic=False)`` fails on a graph break (a Python branch on a
tensor, ``.tolist()``). It no longer breaks on every host read: ``int(t)`` or a boolean mask is
traced as a data-dependent scalar or shape, which on a GPU still synchronises and cannot be
captured. So the backend here (AOTAutograd, which functionalises the graph as inductor would,
without compiling kernels: seconds, not minutes) also refuses a graph that holds such an op.
A compiled run must give what the eager run gives.
"""

from __future__ import annotations

import traceback
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary
from transformers import DynamicCache

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.decode import SpeculativeGenerator, static
from draftheads.decode.planner import Planner
from draftheads.decode.proposers import WithLookup, combined
from draftheads.decode.proposers.eagle import fixed_tree
from draftheads.heads import fingerprint
from tests.conftest import get_target
from tests.test_decode import PROMPTS, batch, drafter

REPO = Path(__file__).resolve().parents[1]


ATEN = torch.ops.aten
BOOL_INDEXED = {ATEN.index.Tensor, ATEN.index_put.default, ATEN.index_put_.default}
# ops whose output depends on a device value read on the host (a sync, uncapturable)
HOST_READ_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "sym_size", "_assert_scalar", "item"}


def host_reads_in(gm: torch.fx.GraphModule) -> list[str]:
    """The nodes of an aten graph that read a device value on the host (boolean indexing included)."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "_opname", "")
        index = node.args[1] if node.target in BOOL_INDEXED else []
        masks = [i for i in index if isinstance(i, torch.fx.Node) and i.meta["val"].dtype == torch.bool]
        if name in HOST_READ_OPS or masks:
            found.append(str(node.target))
    return found


def strict(fn):
    """``fn`` compiled as CUDA graphs need it: one graph, static shapes, no host read."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def check(gm, example_inputs):
        reads = host_reads_in(gm)
        assert not reads, f"host reads in the graph: {reads}"
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=False, backend=aot_autograd(fw_compiler=check))


@pytest.mark.parametrize(
    "fn",
    [lambda x: x[: int(x.sum())] * 2, lambda x: x[x > 0] * 2, lambda x: x * 2 if x.sum() > 0 else x],
    ids=["int", "mask", "branch"],
)
def test_the_strict_compile_refuses_a_host_read(fn):
    with pytest.raises(Exception, match="(?i)host reads|data-dependent|graph break"):
        strict(fn)(torch.ones(3))


def prefilled(model, ids, extra: int) -> static.StaticKV:
    cache = DynamicCache()
    model(input_ids=ids, cache=cache, use_cache=True)
    return static.StaticKV.adopt(cache, static.KVPool(), extra)


@torch.no_grad()
def test_the_static_verify_forward_compiles_as_one_graph():
    model, tok = get_target("llama")
    ids = tok(PROMPTS[1], return_tensors="pt").input_ids
    verifier = static.StaticVerifier(model, capture=False)
    outs = []
    for run in (verifier.forward, strict(verifier.forward)):
        cache = prefilled(model, ids, 8)
        S = cache.get_seq_length()
        entry = verifier._entry(1, 4, cache.capacity, True, cache.lease)
        entry.ids.copy_(torch.tensor([[5, 6, 7, 8]]))
        entry.pos.copy_(torch.arange(S, S + 4)[None])
        chain = static.ancestors(torch.tensor([[0, 0, 1, 2]]))
        entry.mask.copy_(
            static.static_mask(torch.ones(1, S, dtype=torch.bool), chain, cache.capacity, verifier.dtype)
        )
        entry.write.copy_(torch.arange(S, S + 4))
        cache.write_index = entry.write
        out = run(entry, cache, True)
        outs.append((out.logits.clone(), cache.layers[-1].k_buf[:, :, S : S + 4].clone()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("version", [1, 3])
@torch.no_grad()
def test_the_eagle_draft_step_compiles_as_one_graph(version):
    """The fixed-depth, fixed-top-k EAGLE-2 expansion (what cuda-graphs captures) is one graph."""
    model, tok = get_target("llama")
    kw = dict(version=version) if version == 1 else dict(version=3, draft_vocab_size=2000)
    d = drafter("eagle", model, fingerprint(model, tok), **kw)
    H, B, S, k, depth, n = model.config.hidden_size, 2, 6, 3, 4, 9
    torch.manual_seed(0)
    feats = torch.randn(B, S, H * (3 if version == 3 else 1))
    tokens = torch.randint(0, 1000, (B, S))
    cache = DynamicCache()
    d(tokens, d.fuse(feats), torch.arange(S).expand(B, S), None, cache)
    root, pos, h_root = torch.tensor([11, 12]), torch.tensor([S, S]), torch.randn(B, H)
    trees = []
    for compiled in (False, True):
        st = static.StaticKV.adopt(cache, static.KVPool(), (depth - 1) * k)
        valid = torch.zeros(B, st.capacity, dtype=torch.bool)
        valid[:, :S] = True

        expand = partial(fixed_tree, d, st, k=k, depth=depth, n=n)
        run = strict(expand) if compiled else expand
        trees.append(run(valid=valid, base=torch.tensor(S), root=root, pos=pos, h_root=h_root))
    for a, b in zip(*trees):
        assert a.shape == (B, n + 1) and torch.allclose(a.float(), b.float())


@torch.no_grad()
def test_the_medusa_draft_step_compiles_as_one_graph():
    """Medusa's step (its heads on the last state, each depth's top-k into a static tree) is one graph."""
    from draftheads.decode.proposers.medusa import MedusaProposer
    from draftheads.decode.tree import tree_from_choices

    model, tok = get_target("llama")
    d = drafter("medusa", model, fingerprint(model, tok))
    tree = tree_from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    p = MedusaProposer(d, tree)
    torch.manual_seed(0)
    p.hidden = torch.randn(2, model.config.hidden_size)
    root, pos = torch.tensor([11, 12]), torch.tensor([6, 6])
    eager, compiled = p.propose(root, pos), strict(p.propose)(root, pos)
    assert torch.equal(eager.tokens, compiled.tokens) and torch.equal(eager.parents, compiled.parents)
    assert torch.allclose(eager.scores, compiled.scores)


# ---- host reads per decoding step -------------------------------------------------------------
READS = {ATEN._local_scalar_dense.default, ATEN.nonzero.default, ATEN.masked_select.default}


class HostReads(TorchDispatchMode):
    """Counts the reads of device values on the host, i.e. the CUDA syncs a step would make.

    On CPU every tensor is a host tensor, so "on the device" means: computed from the models'
    weights or from what they returned (a taint carried through every op, views and in-place
    writes included). Reads: ``.item()``/``int()``/``float()``/``bool()`` (``_local_scalar_dense``),
    ``.tolist()``, ``nonzero``/``masked_select`` and boolean-mask indexing (their output size).
    The proposer's host-side bookkeeping (lookup's counters, lists) is not a device read.
    """

    def __init__(self, sources) -> None:
        super().__init__()
        self.tainted = WeakTensorKeyDictionary()
        for t in sources:
            self.tainted[t] = True
        self.sites: Counter = Counter()

    def on_device(self, x) -> bool:
        return isinstance(x, torch.Tensor) and (
            x in self.tainted or (x._base is not None and x._base in self.tainted)
        )

    def read(self) -> None:
        ours = [f for f in traceback.extract_stack() if f.filename.startswith(str(REPO))]
        frame = [f for f in ours if "/tests/" not in f.filename and "/.venv/" not in f.filename]
        where = frame[-1] if frame else None
        self.sites[f"{Path(where.filename).relative_to(REPO)}:{where.lineno}" if where else "?"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = any(self.on_device(x) for x in tree_leaves((args, kwargs)))
        bool_index = func in BOOL_INDEXED and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool and self.on_device(i)
            for i in tree_leaves(args[1])
        )
        if device and (func in READS or bool_index):
            self.read()
        out = func(*args, **kwargs)
        if device:
            for o in tree_leaves(out):
                if isinstance(o, torch.Tensor):
                    self.tainted[o] = True
            for arg, spec in zip(args, func._schema.arguments):
                if spec.is_write and isinstance(arg, torch.Tensor):
                    self.tainted[arg] = True
                    if arg._base is not None:
                        self.tainted[arg._base] = True
        return out


def count_step_reads(monkeypatch, gen, modules, enc, new: int) -> list[Counter]:
    """Run ``gen.generate`` and count host reads inside each decoding step (prefill excluded)."""
    per_step: list[Counter] = []
    mode: list[HostReads] = []
    real_step = SpeculativeGenerator.step

    def reading(name):  # a Tensor method that copies the values to the host
        real = getattr(torch.Tensor, name)

        def method(t, *args, **kwargs):
            if not (mode and mode[0].on_device(t)):
                return real(t, *args, **kwargs)
            mode[0].read()
            out = real(t.clone(), *args, **kwargs)  # a host copy: reading it later is free
            if isinstance(out, torch.Tensor):
                del mode[0].tainted[out]
            return out

        monkeypatch.setattr(torch.Tensor, name, method)

    def step(self, *args):
        sources = [t for m in modules for t in (*m.parameters(), *m.buffers())]
        with HostReads(sources) as m:
            mode.append(m)
            try:
                return real_step(self, *args)
            finally:
                mode.clear()
                per_step.append(m.sites)

    for name in ("tolist", "cpu", "numpy"):
        reading(name)
    monkeypatch.setattr(SpeculativeGenerator, "step", step)
    gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=new)
    return per_step


def fixed_drafting(gen: SpeculativeGenerator):
    """``gen`` drafting EAGLE trees at fixed shape (what cuda-graphs captures), without capture."""
    make = gen.make_proposer

    def make_fixed():
        proposer = make()
        inner = proposer.proposer if isinstance(proposer, WithLookup) else proposer
        inner.graphs = static.Graphs(gen.device, capture=False)
        return proposer

    gen.make_proposer = make_fixed
    gen.static_verifier = static.StaticVerifier(gen.target, capture=False)
    return gen


def reads_per_step(monkeypatch, lookup: bool, fixed: bool) -> list[Counter]:
    """Host reads of each step: greedy, EAGLE-3 with cost-aware planning, on tiny-llama."""
    model, tok = get_target("llama")
    d = drafter("eagle", model, fingerprint(model, tok), version=3, draft_vocab_size=2000)
    gen = SpeculativeGenerator(model, d, tok, DecodeConfig(lookup=lookup))
    if fixed:
        fixed_drafting(gen)
    return count_step_reads(monkeypatch, gen, [model, d], batch(tok, [PROMPTS[3]]), 16)


def test_a_step_on_the_cuda_graphs_path_reads_the_device_at_most_twice(monkeypatch):
    """Fixed-shape drafting and static verify: the planner's one transfer of the tree's scores,
    and the accepted tokens."""
    steps = reads_per_step(monkeypatch, lookup=False, fixed=True)
    assert len(steps) > 3
    assert all(sum(sites.values()) <= 2 for sites in steps), steps


def test_the_decoding_loop_itself_reads_the_device_at_most_twice_per_step(monkeypatch):
    steps = reads_per_step(monkeypatch, lookup=True, fixed=False)
    loop = [sum(n for site, n in sites.items() if site.startswith("decode/step.py")) for sites in steps]
    assert max(loop) <= 2, steps


def test_a_default_step_reads_the_device_at_most_twice(monkeypatch):
    steps = reads_per_step(monkeypatch, lookup=True, fixed=False)
    assert len(steps) > 3
    assert all(sum(sites.values()) <= 2 for sites in steps), steps


def test_a_default_step_plans_its_depth_and_merges_lookup_without_reading_the_device(monkeypatch):
    """The proposers read nothing: the EAGLE-2 depth is planned from the previous step's
    expansion, read with the tree's scores, and a lookup chain is merged into the tree on the
    device. The run does both (a chain merged, the depth set below its cap)."""
    merged, depths = [], []
    add_chains, replan = combined.add_chains, Planner.replan
    monkeypatch.setattr(combined, "add_chains", lambda *a: merged.append(1) or add_chains(*a))
    monkeypatch.setattr(Planner, "replan", lambda self, *a: depths.append(replan(self, *a)) or depths[-1])
    steps = reads_per_step(monkeypatch, lookup=True, fixed=False)
    for sites in steps:
        assert not [s for s in sites if s.startswith(("decode/proposers/", "decode/select.py"))], sites
    assert merged and depths and min(depths) < DecodeConfig().depth
