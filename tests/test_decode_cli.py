"""``draftheads tree`` and ``draftheads generate`` on a tiny target, in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftheads.conf.cli import main
from draftheads.conf.errors import UserError
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.tree_select import head_accuracies, pick_size
from draftheads.heads import EagleDrafter, MedusaHeads, fingerprint
from tests.conftest import get_target


@pytest.fixture(scope="module")
def medusa_dir(tmp_path_factory):
    model, tok = get_target("llama")
    d = tmp_path_factory.mktemp("medusa")
    MedusaHeads(fingerprint(model, tok), num_heads=3).save_pretrained(d)
    return d


def test_tree_command_measures_picks_and_saves_a_tree_the_generator_uses(medusa_dir, capsys):
    args = ["target=tiny-llama", f"heads={medusa_dir}", "decode.tree_prompts=2", "decode.tree_new_tokens=12"]
    assert main(["tree", *args, "decode.tree_size=0", "decode.tree_max_size=8"]) == 0
    out = capsys.readouterr().out
    assert "verification cost on cpu" in out and "saved to" in out
    rec = json.loads((medusa_dir / "tree.json").read_text())
    assert set(rec["verify_cost_s"]) == {"1", "2", "4", "8"} and len(rec["accuracies"]) == 3
    assert main(["tree", *args, "decode.tree_size=6"]) == 0
    rec = json.loads((medusa_dir / "tree.json").read_text())
    assert rec["size"] == 6 and len(rec["choices"]) == 5
    model, tok = get_target("llama")
    from draftheads.heads import Drafter

    d = Drafter.from_pretrained(medusa_dir, target=model, tokenizer=tok)
    gen = SpeculativeGenerator(model, d, tok, tree_dir=str(medusa_dir))  # decode.tree=auto
    assert [list(c) for c in gen.static.choices] == rec["choices"]


def test_an_interrupted_tree_write_keeps_the_tree_before_it(medusa_dir, monkeypatch, capsys):
    args = [
        "tree",
        "target=tiny-llama",
        f"heads={medusa_dir}",
        "decode.tree_prompts=2",
        "decode.tree_new_tokens=8",
    ]
    assert main([*args, "decode.tree_size=4"]) == 0
    before = (medusa_dir / "tree.json").read_text()
    real = Path.write_text

    def torn(self, text, *a, **kw):  # half the tree written, then Ctrl-C
        if "tree.json" not in self.name:
            return real(self, text, *a, **kw)
        real(self, text[: len(text) // 2], *a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", torn)
    assert main([*args, "decode.tree_size=6"]) == 130
    monkeypatch.undo()
    assert (medusa_dir / "tree.json").read_text() == before
    assert not [p.name for p in medusa_dir.iterdir() if p.name.startswith(".tree.json")]


def test_generate_command_streams_then_prints_tau(medusa_dir, capsys):
    assert (
        main(["generate", "target=tiny-llama", f"heads={medusa_dir}", "prompt=Hi", "decode.max_new_tokens=8"])
        == 0
    )
    out = capsys.readouterr().out
    assert "tokens/s" in out and "tau" in out


def test_heads_none_is_lookup_decoding_in_generate_and_eval(tmp_path, capsys):
    """No drafter: generate streams with lookup branches alone; eval reports it as the drafter
    "lookup", identical to greedy, on the decoder's backend."""
    argv = ["generate", "target=tiny-llama", "heads=none", "prompt=Hi there", "decode.max_new_tokens=8"]
    assert main(argv) == 0
    assert "backend" in capsys.readouterr().out
    out = tmp_path / "eval"
    argv = ["eval", "target=tiny-llama", "heads=none", "eval.max_prompts=2", "decode.max_new_tokens=10"]
    assert main([*argv, f"eval.out_dir={out}", "eval.warmup=0"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["drafter"] == "lookup" and rep["greedy_identical"] == 1.0 and rep["speedup_vs_stock"] > 0
    assert main(["tree", "target=tiny-llama", "heads=none"]) == 1
    assert "pass heads=DIR of such heads, not none" in capsys.readouterr().err


def test_command_user_errors(medusa_dir, tmp_path, capsys):
    assert main(["generate", "target=tiny-llama", f"heads={medusa_dir}"]) == 1
    assert "needs a prompt" in capsys.readouterr().err
    assert main(["generate", "target=tiny-llama", "prompt=x"]) == 1
    assert "heads=" in capsys.readouterr().err
    assert (
        main(["generate", "target=tiny-llama", f"heads={medusa_dir}", "prompt=x", "decode.tree=chain7"]) == 1
    )
    assert "drafter has 3 heads" in capsys.readouterr().err
    model, tok = get_target("llama")
    EagleDrafter(fingerprint(model, tok), target_config=model.config.to_dict()).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="heads that index a static tree by depth, not an EAGLE-1 drafter"):
        from draftheads.conf.cli import parse
        from draftheads.conf.commands.decode import tree

        tree(parse(["tree", "target=tiny-llama", f"heads={tmp_path}"]).args)


def test_head_accuracies_and_size_choice():
    model, tok = get_target("llama")
    heads = MedusaHeads(fingerprint(model, tok), num_heads=2).attach(model)
    acc = head_accuracies(model, heads, tok, ["Hello"], new_tokens=10, topk=5)
    assert len(acc) == 2 and all(len(r) == 5 and 0 <= sum(r) <= 1 for r in acc)
    good = [[0.8, 0.1], [0.7, 0.1]]
    flat = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}  # a big GPU: verifying more is free -> biggest tree
    assert pick_size(good, flat, 0.0, 6)[0] == 6
    steep = {1: 1.0, 2: 3.0, 4: 6.0, 8: 12.0}  # every token costs a full step -> no tree
    assert pick_size(good, steep, 0.0, 6)[0] == 1
