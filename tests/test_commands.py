"""Each command reads its own keys: refusals, --help, free-text prompts, documented forms, bad paths."""

from __future__ import annotations

import pytest

from draftheads.conf.cli import main, parse
from draftheads.heads import MedusaHeads, fingerprint
from tests.conftest import get_target


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0].removeprefix("error: ")


def snapshot(root):
    """Every path under ``root`` with its size and modification time."""
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def medusa_dir(tmp_path_factory):
    model, tok = get_target("llama")
    d = tmp_path_factory.mktemp("medusa")
    MedusaHeads(fingerprint(model, tok), num_heads=2).save_pretrained(d)
    return d


@pytest.mark.parametrize(
    "argv,line",
    [
        (["eval", "data.path=X"], "eval reads its prompts from eval.prompts; use eval.prompts=X"),
        (
            ["generate", "max_new_tokens=5"],
            "generate does not read max_new_tokens; use decode.max_new_tokens=5",
        ),
        (["info", "decode.depth=3"], "info does not read decode.depth; it reads target, heads, revision"),
        (["export", "out=x"], "out is now out_dir; use out_dir=x"),
        (["eval", "eval.output_dir=x"], "eval.output_dir is now eval.out_dir; use eval.out_dir=x"),
        (["train", "train.output_dir=x"], "train.output_dir is now train.out_dir; use train.out_dir=x"),
        (
            ["tree", "data.max_rows=3"],
            "tree measures on held-out prompts; set how many with decode.tree_prompts=3",
        ),
        (["eval", "prompt=hi"], "eval reads its prompts from eval.prompts; use eval.prompts=FILE_OR_NAME"),
        (["info", "target=tiny-lama"], "target=tiny-lama is not a target option"),
        (
            ["train", "target=tiny-lama"],
            "target=tiny-lama is not a target option; use one of hf|smollm2|tiny-gpt2",
        ),
        (["speed", "speed.batch=[1]"], "unknown config key speed.batch"),
    ],
)
def test_a_key_the_command_does_not_read_is_refused_naming_the_right_one(argv, line, capsys):
    assert main(argv) == 1
    assert line in one_line_error(capsys)


def test_the_one_word_for_an_output_location_sets_the_schema_field():
    assert parse(["export", "out_dir=/tmp/x"]).args.out == "/tmp/x"
    assert parse(["eval", "eval.out_dir=/tmp/e"]).args.eval.output_dir == "/tmp/e"
    assert parse(["train", "train.out_dir=/tmp/t"]).args.train.output_dir == "/tmp/t"


def test_command_help_lists_that_commands_keys_only(capsys):
    assert main(["eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert "eval.prompts" in out and "eval.out_dir" in out and "decode.max_new_tokens" in out
    assert "data.path" not in out and "train.lr" not in out and "output_dir" not in out
    assert "target=<hf|smollm2|" in out
    assert main(["speed", "--help"]) == 0
    assert "speed.batch_sizes = [1, 4, 8]" in capsys.readouterr().out


TEXTS = [
    "Hello, world",
    "She said \"it's fine\" and 'left'",
    "Tell me about 🚀 and 🧪, please",
    "مرحبا بالعالم، كيف حالك؟",
    "line one\nline two, with a comma\n\nline four",
]


@pytest.mark.parametrize("text", TEXTS, ids=["comma", "quotes", "emoji", "rtl", "newlines"])
def test_a_prompt_is_free_text_in_every_form(text, medusa_dir, tmp_path, capsys):
    file = tmp_path / "prompt.txt"
    file.write_text(text, encoding="utf-8")
    for form in (
        [f"prompt={text}"],
        ["--prompt", text],
        [f"--prompt={text}"],
        [f"prompt_file={file}"],
    ):
        assert parse(["generate", "target=tiny-llama", *form]).args.prompt == text
    argv = [
        "generate",
        "target=tiny-llama",
        f"heads={medusa_dir}",
        "--prompt",
        text,
        "decode.max_new_tokens=4",
    ]
    assert main(argv) == 0
    assert "tokens/s" in capsys.readouterr().out


def test_a_prompt_longer_than_the_targets_context_is_refused(medusa_dir, capsys):
    argv = ["generate", "target=tiny-llama", f"heads={medusa_dir}", "prompt=" + "word " * 1100]
    assert main(argv) == 1
    line = one_line_error(capsys)
    assert "the target's context is 1024" in line and "shorten the prompt" in line


def test_documented_tree_list_and_field_forms_work(medusa_dir, capsys):
    assert parse(["generate", "decode.tree=[[0],[0,0]]"]).args.decode.tree == "[[0],[0,0]]"
    argv = [
        "generate",
        "target=tiny-llama",
        f"heads={medusa_dir}",
        "prompt=Hi",
        "decode.tree=[[0],[1],[0,0]]",
    ]
    assert main([*argv, "decode.max_new_tokens=4"]) == 0
    assert parse(["data", "data.fields.text=body"]).args.data.fields == {"text": "body"}


@pytest.mark.parametrize("command", ["eval", "export", "tree"])
@pytest.mark.parametrize("bad", ["/proc/x", "a-file"])
def test_an_unwritable_output_directory_is_refused_before_any_work(
    command, bad, medusa_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("keep me")
    key = {"eval": "eval.out_dir", "export": "out_dir", "tree": "out_dir"}[command]
    extra = ["format=vllm"] if command == "export" else []
    before, heads_before = snapshot(tmp_path), snapshot(medusa_dir)
    assert main([command, "target=tiny-llama", f"heads={medusa_dir}", f"{key}={bad}", *extra]) == 1
    line = one_line_error(capsys)
    assert line.startswith(f"{key}={bad} ")
    assert ("existing file" in line) if bad == "a-file" else ("cannot be written" in line)
    assert snapshot(tmp_path) == before and snapshot(medusa_dir) == heads_before


def test_export_into_the_checkpoint_itself_is_refused(medusa_dir, capsys):
    before = snapshot(medusa_dir)
    assert main(["export", f"heads={medusa_dir}", "format=vllm", f"out_dir={medusa_dir}"]) == 1
    assert "is the checkpoint itself" in one_line_error(capsys)
    assert snapshot(medusa_dir) == before


def test_data_will_not_write_into_a_checkpoint_directory(medusa_dir, capsys):
    before = snapshot(medusa_dir)
    assert main(["data", "target=tiny-llama", "data.max_rows=2", f"out_dir={medusa_dir}"]) == 1
    assert "holds a drafter checkpoint or training run" in one_line_error(capsys)
    assert snapshot(medusa_dir) == before


def test_an_unknown_baseline_is_refused_before_loading(medusa_dir, tmp_path, capsys):
    from draftheads.conf.errors import UserError
    from draftheads.decode.evaluate import check_baselines

    with pytest.raises(UserError, match="unknown eval baseline 'pdl'"):
        check_baselines(["pdl"], assistant=False)
    with pytest.raises(UserError, match="needs eval.assistant_model"):
        check_baselines(["assisted"], assistant=False)
    assert (
        main(["eval", f"heads={medusa_dir}", "eval.baselines=[pdl]", f"eval.out_dir={tmp_path / 'e'}"]) == 1
    )
    assert "pdl" in one_line_error(capsys) and not (tmp_path / "e").exists()
