"""Damaged or foreign speculators files: each import stops with one line that names the file's own
field and value (never a ``draft.*`` key of ours, never transformers' list of model types), and
``draftheads info`` on one prints that line, not a traceback."""

from __future__ import annotations

import pytest

from draftheads.conf.cli import main
from draftheads.conf.errors import UserError
from draftheads.heads import Drafter
from draftheads.heads.export import export_drafter
from tests.test_bad_input import one_line_error
from tests.test_dflash_formats import dflash
from tests.test_export import eagle
from tests.test_peagle_draft import peagle
from tests.test_speculators_format import read, write_config


def layer(**changes):
    """A change to the file's ``transformer_layer_config``."""
    return lambda c: c["transformer_layer_config"].update(changes)


CASES = [
    # (kind, change to config.json, a part of the one line)
    (
        "dflash",
        layer(layer_types=["full_attention"], num_hidden_layers=2),
        "transformer_layer_config.layer_types has 1 entries but transformer_layer_config.num_hidden_layers=2",
    ),
    ("eagle3", layer(model_type="llamaa"), "transformer_layer_config.model_type='llamaa' is not a transformers"),
    ("eagle3", layer(hidden_size="wide"), "transformer_layer_config is not a valid llama config"),
    ("eagle3", lambda c: c.pop("transformer_layer_config"), "config.json has no transformer_layer_config"),
    ("dflash", lambda c: c.pop("transformer_layer_config"), "config.json has no transformer_layer_config"),
    ("dflash", lambda c: c.update(mask_token_id=100), "mask_token_id=100 is the ordinary text token"),
    (
        "eagle3",
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 9]),
        "eagle_aux_hidden_state_layer_ids=[1, 2, 9]: the target has 4 layers, so ids must be in 1..4",
    ),
    (
        "eagle3",
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2]),
        "eagle_aux_hidden_state_layer_ids=[1, 2]: the drafter reads 3 target layers",
    ),
    ("eagle3", lambda c: c.update(eagle_aux_hidden_state_layer_ids="1,2,3"), "eagle_aux_hidden_state_layer_ids='1,2,3'"),
    (
        "dflash",
        lambda c: c.update(aux_hidden_state_layer_ids=[1, 2, 9]),
        "aux_hidden_state_layer_ids=[1, 2, 9] reach outside 1..3",
    ),
    ("peagle", layer(model_type="qwen9"), "transformer_layer_config.model_type='qwen9' is not a transformers"),
    ("peagle", lambda c: c.pop("transformer_layer_config"), "config.json has no transformer_layer_config"),
    (
        "peagle",
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
        "eagle_aux_hidden_state_layer_ids=[0, 1, 2]: layer 0 is the embedding output",
    ),
]  # fmt: skip


def write_export(kind: str, folder, tiny_llama):
    """An EAGLE-3, DFlash or P-EAGLE drafter for tiny-llama exported in speculators' format to ``folder``."""
    model, _, fp = tiny_llama
    if kind == "peagle":
        drafter = peagle(model, fp)
    else:
        drafter = eagle(model, fp, 3, feature_layers=[1, 2, 3]) if kind == "eagle3" else dflash(model, fp)
    return export_drafter(drafter, "speculators", folder)


@pytest.mark.parametrize("kind,change,needle", CASES, ids=[n for _, _, n in CASES])
def test_a_damaged_speculators_file_is_named_by_its_own_field(tmp_path, tiny_llama, kind, change, needle):
    model, tok, _ = tiny_llama
    out = write_export(kind, tmp_path / "spec", tiny_llama)
    cfg, _ = read(out)
    change(cfg)
    write_config(out, cfg)
    with pytest.raises(UserError) as err:
        Drafter.from_pretrained(out, target=model, tokenizer=tok)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and "draft." not in msg and len(msg) < 500, msg


def test_info_on_a_damaged_speculators_file_prints_one_line(tmp_path, tiny_llama, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = write_export("dflash", tmp_path / "spec", tiny_llama)
    cfg, _ = read(out)
    layer(layer_types=["full_attention"], num_hidden_layers=2)(cfg)
    write_config(out, cfg)
    assert main(["info", "heads=spec", "target=tiny-llama"]) == 1
    assert "layer_types has 1 entries" in one_line_error(capsys)


def test_the_checked_fields_pass_on_an_intact_export(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    for kind in ("eagle3", "dflash"):
        out = write_export(kind, tmp_path / kind, tiny_llama)
        assert Drafter.from_pretrained(out, target=model, tokenizer=tok).kind == (
            "eagle" if kind == "eagle3" else kind
        )
