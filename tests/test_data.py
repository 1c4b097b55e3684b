"""Data pipeline: formats, loss masks on three chat templates, prepare_dataset accounting, prompts."""

from __future__ import annotations

import copy
import json

import pytest

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DataConfig
from draftheads.data.chat import encode_chat, user_turn_prefix
from draftheads.data.embedded import HELDOUT_PERCENT, embedded_items, is_heldout
from draftheads.data.formats import RowError, detect_format, to_example
from draftheads.data.prepare import prepare_dataset
from draftheads.data.prompts import REPO, SHARED, load_prompts, shared_path

CHAT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello there"},
    {"role": "user", "content": "more"},
    {"role": "assistant", "content": "ok fine"},
]

# Llama-3 style, with {% generation %} markers (content is trimmed by the template).
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Mistral [INST] style, no markers; the system prompt is folded into the first user turn.
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def trained_runs(tok, ids, mask) -> list[str]:
    """The decoded text of each maximal run of trained tokens."""
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs


def with_template(tok, template: str, specials: list[str]):
    t = copy.deepcopy(tok)
    t.chat_template = template
    if specials:
        t.add_special_tokens({"additional_special_tokens": specials})
    return t


@pytest.fixture(scope="module")
def llama3_tok(tokenizer):
    return with_template(tokenizer, LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])


@pytest.fixture(scope="module")
def mistral_tok(tokenizer):
    t = with_template(tokenizer, MISTRAL, [])
    t.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>"})
    return t


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


# ---- loss masks: exact spans on three templates ------------------------------------------


def test_smollm2_template_trains_every_assistant_turn_and_its_end_token(tokenizer):
    ids, mask = encode_chat(tokenizer, CHAT)
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant")
    assert trained_runs(tokenizer, ids, mask) == ["hello there<|im_end|>", "ok fine<|im_end|>"]
    # Exact positions: the answer starts right after "<|im_start|>assistant\n" and the "\n" the
    # template writes after <|im_end|> is not trained.
    prompt = tokenizer.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True)
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    n = len(tokenizer("hello there<|im_end|>", add_special_tokens=False)["input_ids"])
    assert mask[:start] == [0] * start and mask[start : start + n] == [1] * n and mask[start + n] == 0
    assert tokenizer.decode(ids[start + n]) == "\n"


def test_llama3_style_template_with_generation_markers(llama3_tok):
    t = llama3_tok
    markers = encode_chat(t, CHAT, method="markers")
    prefix = encode_chat(t, CHAT, method="prefix")
    assert markers == prefix  # the template's own markers and prefix rendering agree
    ids, mask = markers
    assert trained_runs(t, ids, mask) == ["hello there<|eot_id|>", "ok fine<|eot_id|>"]
    padded = [dict(m, content=f"  {m['content']}  ") for m in CHAT]  # the template trims content
    assert trained_runs(t, *encode_chat(t, padded)) == ["hello there<|eot_id|>", "ok fine<|eot_id|>"]


def test_mistral_style_template_without_markers(mistral_tok):
    t = mistral_tok
    ids, mask = encode_chat(t, CHAT)
    assert t.decode(ids) == "<s>[INST] hi [/INST]hello there</s>[INST] more [/INST]ok fine</s>"
    assert trained_runs(t, ids, mask) == ["hello there</s>", "ok fine</s>"]
    with pytest.raises(RowError, match="roles must alternate"):
        encode_chat(t, [CHAT[0], CHAT[0], CHAT[1]])


def test_system_turns_are_never_trained(tokenizer):
    chat = [{"role": "system", "content": "be brief"}] + CHAT[:2]
    ids, mask = encode_chat(tokenizer, chat)
    assert trained_runs(tokenizer, ids, mask) == ["hello there<|im_end|>"]
    assert "be brief" in tokenizer.decode(ids)


def test_user_turn_prefix_comes_from_the_template(tokenizer, mistral_tok):
    assert user_turn_prefix(tokenizer).endswith("<|im_end|>\n<|im_start|>user\n")
    assert user_turn_prefix(mistral_tok) == "<s>[INST] "


# ---- formats ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row,fields,fmt,messages",
    [
        (
            {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
            {},
            "sharegpt",
            [("user", "q"), ("assistant", "a")],
        ),
        (
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
            {},
            "messages",
            [("system", "s"), ("user", "q")],
        ),
        (
            {"instruction": "do", "input": "this", "output": "done"},
            {},
            "alpaca",
            [("user", "do\n\nthis"), ("assistant", "done")],
        ),
        ({"question": "2+2?", "answer": "4"}, {}, "alpaca", [("user", "2+2?"), ("assistant", "4")]),
        (
            {"question_id": 7, "category": "qa", "turns": ["a", "b"]},
            {},
            "prompt",
            [("user", "a"), ("user", "b")],
        ),
        ({"prompt": "p"}, {}, "prompt", [("user", "p")]),
        (
            {"dialog": [{"speaker": "user", "text": "q"}, {"speaker": "model", "text": "a"}]},
            {"conversations": "dialog", "from": "speaker", "value": "text"},
            "sharegpt",
            [("user", "q"), ("assistant", "a")],
        ),
    ],
)
def test_formats_are_detected_and_normalised(row, fields, fmt, messages):
    detected, f = detect_format(row.keys(), fields)
    assert detected == fmt
    ex = to_example(row, detected, f, "r0")
    assert [(m["role"], m["content"]) for m in ex.messages] == messages


def test_text_format_and_unknown_columns():
    fmt, f = detect_format(["body"], {"text": "body"})
    assert fmt == "text" and to_example({"body": "x y"}, fmt, f, "r").text == "x y"
    with pytest.raises(UserError, match="cannot detect the data format .* set data.format="):
        detect_format(["foo"], {})


@pytest.mark.parametrize(
    "row,reason",
    [
        ({"instruction": "q"}, None),  # prompt-only alpaca row: valid, no answer
        ({"instruction": "q", "output": 3}, "output is int, not a string"),
        ({"instruction": "  ", "output": "a"}, "empty instruction"),
        ({"instruction": "q\ud800", "output": "a"}, "bad encoding"),
        ({"conversations": "nope"}, "not a non-empty list"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "unknown role 'alien'"),
    ],
)
def test_malformed_rows_raise_row_errors_with_reasons(row, reason):
    fmt = "alpaca" if "instruction" in row else "sharegpt"
    if reason is None:
        assert not to_example(row, fmt, {}, "r").has_answer()
        return
    with pytest.raises(RowError, match=reason):
        to_example(row, fmt, {}, "r")


# ---- prepare_dataset --------------------------------------------------------------------

GOOD = {"instruction": "Say hi.", "output": "Hi there, nice to meet you!"}


def test_prepare_counts_skips_drops_and_truncation(tmp_path, tokenizer):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            GOOD,
            {"instruction": "q", "output": 5},  # malformed: wrong type
            "{not json",  # malformed: invalid JSON
            {"instruction": "prompt only"},  # dropped: no answer
            {"instruction": "Long.", "output": "word " * 400},  # truncated
            GOOD,
        ],
    )
    with open(path, "ab") as f:
        f.write(b'{"instruction": "\xff\xfe", "output": "a"}\n')  # malformed: not UTF-8
    ds, rep = prepare_dataset(DataConfig(path=path, max_length=128), tokenizer)
    s = rep.sources[0]
    assert (s.read, s.skipped, s.dropped, s.truncated, s.kept) == (7, 3, 1, 1, 3)
    assert len(ds) == 3 and set(ds.column_names) >= {"input_ids", "loss_mask", "source", "id"}
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) <= 128 for r in ds)
    assert max(len(r["input_ids"]) for r in ds) == 128
    assert rep.tokens == sum(len(r["input_ids"]) for r in ds)
    assert rep.loss_tokens == sum(sum(r["loss_mask"]) for r in ds)
    text = rep.format()
    assert "output is int, not a string" in text and "invalid JSON" in text and "bad encoding" in text
    assert "d.jsonl:2: output is int" in text  # first skipped rows are named
    trained = tokenizer.decode([i for i, m in zip(ds[0]["input_ids"], ds[0]["loss_mask"]) if m])
    assert trained == GOOD["output"] + "<|im_end|>"


def test_strict_mode_and_empty_results_are_one_line_errors(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, {"instruction": "q", "output": ["x"]}])
    with pytest.raises(UserError, match=r"malformed row d.jsonl:2 .*output is list.*data.strict=false"):
        prepare_dataset(DataConfig(path=path, strict=True), tokenizer)
    only_prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(UserError, match="no training rows .*2x prompt-only row has no answer") as e:
        prepare_dataset(DataConfig(path=only_prompts), tokenizer)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="does not exist"):
        prepare_dataset(DataConfig(path=str(tmp_path / "missing.jsonl")), tokenizer)
    with pytest.raises(UserError, match="data.format=xml is unknown"):
        prepare_dataset(DataConfig(path=path, format="xml"), tokenizer)


def test_plain_text_rows_train_every_token_and_formats_can_be_forced(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", [{"body": "def f(x):\n    return x"}])
    ds, _ = prepare_dataset(DataConfig(path=path, format="text", fields={"text": "body"}), tokenizer)
    assert ds[0]["loss_mask"] == [1] * len(ds[0]["input_ids"])
    assert tokenizer.decode(ds[0]["input_ids"]) == "def f(x):\n    return x"


def test_packing_keeps_documents_apart(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD] * 10)
    plain, _ = prepare_dataset(DataConfig(path=path), tokenizer)
    n = len(plain[0]["input_ids"])
    ds, rep = prepare_dataset(DataConfig(path=path, packing=True, max_length=3 * n), tokenizer)
    assert rep.packed and [len(r["input_ids"]) for r in ds] == [3 * n, 3 * n, 3 * n, n]
    row = ds[0]
    assert row["position_ids"] == list(range(n)) * 3
    assert row["loss_mask"] == plain[0]["loss_mask"] * 3  # document starts are never trained anyway
    assert rep.loss_tokens == sum(sum(r["loss_mask"]) for r in plain)


def test_packing_never_trains_a_document_start(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "alpha beta"}, {"text": "gamma delta"}])
    ds, _ = prepare_dataset(DataConfig(path=path, packing=True, max_length=64), tokenizer)
    n0 = len(tokenizer("alpha beta")["input_ids"])
    assert len(ds) == 1 and ds[0]["loss_mask"][0] == 1 and ds[0]["loss_mask"][n0] == 0


def test_mixture_weights_and_per_source_reports(tmp_path, tokenizer):
    a = write_jsonl(
        tmp_path / "a.jsonl", [{"instruction": f"a{i}", "output": f"answer {i}"} for i in range(30)]
    )
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": f"text number {i}"} for i in range(10)])
    cfg = DataConfig(mixture=[{"path": a, "weight": 1, "name": "A"}, {"path": b, "weight": 3, "name": "B"}])
    ds, rep = prepare_dataset(cfg, tokenizer)
    by = rep.by_source()
    assert (by["A"].kept, by["A"].mixed_rows, by["B"].kept, by["B"].mixed_rows) == (30, 10, 10, 30)
    assert ds["source"].count("A") == 10 and ds["source"].count("B") == 30
    assert len(set(ds.filter(lambda r: r["source"] == "B")["id"])) == 10  # B is repeated 3x
    assert "A" in rep.format() and "30 (w 3)" in rep.format()
    again, _ = prepare_dataset(cfg, tokenizer)
    assert again["id"] == ds["id"]  # deterministic
    with pytest.raises(UserError, match=r"data.mixture\[0\] has unknown keys \['wieght'\]"):
        prepare_dataset(DataConfig(mixture=[{"path": a, "wieght": 2}]), tokenizer)


def test_user_data_heldout_fraction_splits_by_content(tmp_path, tokenizer):
    rows = [{"instruction": f"q{i}", "output": f"the answer is {i}"} for i in range(200)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = DataConfig(path=path, heldout_fraction=0.2)
    train, rep = prepare_dataset(cfg, tokenizer, "train")
    held, _ = prepare_dataset(cfg, tokenizer, "heldout")
    assert len(train) + len(held) == 200 and 20 < len(held) < 60 and rep.sources[0].heldout == len(held)
    assert not set(train["id"]) & set(held["id"])
    with pytest.raises(UserError, match="set data.heldout_fraction"):
        prepare_dataset(DataConfig(path=path), tokenizer, "heldout")


# ---- embedded data and prompts ----------------------------------------------------------


def test_embedded_split_is_fixed_and_disjoint():
    train = embedded_items("all", "train")
    held = embedded_items("all", "heldout")
    assert {i.component for i in train} == {"humaneval", "pydoc", "stdlib"}
    assert not {i.symbol for i in train} & {i.symbol for i in held}
    assert all(is_heldout(i.symbol) for i in held) and not any(is_heldout(i.symbol) for i in train)
    share = len(held) / (len(held) + len(train))
    assert abs(share - HELDOUT_PERCENT / 100) < 0.03
    he = [i for i in train + held if i.component == "humaneval"]
    assert len(he) == 164 and "HumanEval/0" in {i.symbol for i in he}
    assert is_heldout("HumanEval/2") and not is_heldout("HumanEval/0")  # documented, fixed split


def test_embedded_prepare_never_contains_heldout_prompts(tokenizer):
    ds, rep = prepare_dataset(DataConfig(max_rows=40), tokenizer)
    assert [s.name for s in rep.sources] == ["embedded:humaneval", "embedded:pydoc", "embedded:stdlib"]
    assert len(ds) == 120 and set(ds["source"]) == {s.name for s in rep.sources}
    held_ids = {p.id for p in load_prompts("heldout")}
    assert held_ids and not held_ids & set(ds["id"])
    row = ds[0]
    trained = tokenizer.decode([i for i, m in zip(row["input_ids"], row["loss_mask"]) if m])
    assert trained.startswith("```python\n") and trained.endswith("```<|im_end|>")


def test_load_prompts_sources(tmp_path):
    he = load_prompts("humaneval", max_prompts=3)
    assert [p.id for p in he] == ["humaneval/HumanEval/0", "humaneval/HumanEval/1", "humaneval/HumanEval/2"]
    path = write_jsonl(
        tmp_path / "question.jsonl", [{"question_id": 81, "category": "writing", "turns": ["a", "b"]}]
    )
    (p,) = load_prompts(path)
    assert (p.id, p.category, p.turns) == ("81", "writing", ["a", "b"])
    with pytest.raises(UserError, match="absent; check the path"):
        load_prompts(str(tmp_path / "nope" / "question.jsonl"))


def test_load_prompts_from_shared_spec_bench():
    try:
        shared_path("spec_bench")
    except UserError as e:
        assert "spec_bench data is absent: looked for" in str(e)
        pytest.skip(str(e))
    rows = load_prompts("spec_bench")
    assert len(rows) == 320 and sum(len(r.turns) == 2 for r in rows) == 80
    assert {r.category for r in rows} >= {"writing", "translation", "qa", "math_reasoning"}


def test_an_absent_shared_set_names_each_place_it_looked_once(monkeypatch):
    monkeypatch.setitem(SHARED, "spec_bench", "spec_bench/no-such-file.jsonl")
    monkeypatch.chdir(REPO)  # the working directory and the repository give the same place
    with pytest.raises(UserError, match="spec_bench data is absent: looked for ") as e:
        shared_path("spec_bench")
    # the place looked once, and the file's name in the two command-line keys that take it
    assert str(e.value).count("no-such-file.jsonl") == 3
    assert "speed.sampling_sets=[heldout,/path/to/no-such-file.jsonl]" in str(e.value)
    assert "load_prompts(" not in str(e.value)


def test_an_absent_mixture_component_fails_unless_optional_and_in_data_dir_resolves(tmp_path, tokenizer):
    (tmp_path / "sets").mkdir()
    rows = [{"instruction": f"Say {i}.", "output": f"{i} said, as asked."} for i in range(3)]
    (tmp_path / "sets" / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    here = {"name": "mine", "path": "sets/mine.jsonl", "in_data_dir": True}
    gone = {"name": "gone", "path": str(tmp_path / "absent.jsonl")}
    with pytest.raises(UserError, match="absent.jsonl does not exist"):
        prepare_dataset(
            DataConfig(mixture=[here, gone], data_dir=str(tmp_path), min_loss_tokens=1), tokenizer
        )
    cfg = DataConfig(mixture=[here, {**gone, "optional": True}], data_dir=str(tmp_path), min_loss_tokens=1)
    ds, report = prepare_dataset(cfg, tokenizer)
    assert [s.name for s in report.sources] == ["mine"] and report.sources[0].kept == 3
    assert report.missing == [f"gone ({tmp_path / 'absent.jsonl'} absent)"]
    assert set(ds["source"]) == {"mine"}
