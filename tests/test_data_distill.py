"""Self-distillation: shards with provenance, exact resume after a kill, target-written prompts."""

from __future__ import annotations

import json
from functools import partial

import pytest

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DataConfig, DistillConfig
from draftheads.data.chat import encode_chat
from draftheads.data.distill.generate import hf_generate
from draftheads.data.distill.roundtrip import ROUNDTRIP, roundtrip_changes
from draftheads.data.distill.run import distill
from draftheads.data.distill.shards import MANIFEST
from draftheads.data.prepare import prepare_dataset
from draftheads.data.prompts import PromptRow
from draftheads.data.self_prompts import diversity, self_prompts
from tests.conftest import get_target

PROMPTS = [PromptRow(f"p{i}", "test", [f"Question number {i}" + "?" * (i % 3)]) for i in range(10)]
PROMPTS[3] = PromptRow("p3", "multi", ["First turn", "Second turn"])


def shards(d) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(d.glob("shard-*.jsonl"))}


def cfg_for(path, **kw) -> DistillConfig:
    base = dict(out_dir=str(path), max_new_tokens=6, batch_size=3, shard_rows=4, temperature=1.0, top_p=0.9)
    return DistillConfig(**{**base, **kw})


def test_distill_writes_chats_with_generation_params_and_fingerprint(tmp_path, tiny_llama):
    model, tok, fp = tiny_llama
    out = distill(model, tok, PROMPTS, cfg_for(tmp_path, temperature=0.0), show_progress=False)
    rows = [json.loads(line) for text in shards(out).values() for line in text.splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(p.id for p in PROMPTS) and len(shards(out)) == 3
    multi = next(r for r in rows if r["id"] == "p3")
    assert [m["role"] for m in multi["messages"]] == ["user", "assistant", "user", "assistant"]
    assert len(multi["finish"]) == 2 and set(multi["finish"]) <= {"stop", "length"}
    assert rows[0]["gen"]["temperature"] == 0.0 and rows[0]["gen"]["tokenizer_hash"] == fp.tokenizer_hash[:16]
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["fingerprint"] == fp.to_dict() and manifest["generation"]["max_new_tokens"] == 6
    # Greedy answers are the target's own greedy continuation.
    prompt = tok.apply_chat_template(multi["messages"][:1], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    ref = model.generate(
        ids, max_new_tokens=6, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    assert multi["messages"][1]["content"] == tok.decode(ref[0, ids.shape[1] :], skip_special_tokens=True)
    # The shards are a training set as they are.
    ds, rep = prepare_dataset(DataConfig(path=str(out / "shard-00000.jsonl"), min_loss_tokens=1), tok)
    assert rep.sources[0].format == "messages" and rep.sources[0].read == 6


def test_interrupted_then_resumed_run_equals_a_straight_run(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    straight = distill(model, tok, PROMPTS, cfg_for(tmp_path / "a"), show_progress=False)

    base, calls = hf_generate(model, tok), {"n": 0}

    def dies_on_third_batch(prompts, params, seed):
        calls["n"] += 1
        if calls["n"] == 4:  # batches 0 and 1 done (batch 1 has the two-turn row), killed in batch 2
            raise KeyboardInterrupt
        return base(prompts, params, seed)

    with pytest.raises(KeyboardInterrupt):
        distill(
            model, tok, PROMPTS, cfg_for(tmp_path / "b"), generate=dies_on_third_batch, show_progress=False
        )
    part = tmp_path / "b"
    first = part / "shard-00000.jsonl"
    lines = first.read_text().splitlines(keepends=True)
    assert 0 < len(lines) < 10
    # Simulate a kill in the middle of a write as well: a torn, half-written last line.
    first.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    resumed = distill(model, tok, PROMPTS, cfg_for(part), show_progress=False)
    assert shards(resumed) == shards(straight)
    again = distill(model, tok, PROMPTS, cfg_for(part), show_progress=False)  # nothing left to do
    assert shards(again) == shards(straight)
    with pytest.raises(UserError, match=r"holds a distillation with other settings \(generation\)"):
        distill(model, tok, PROMPTS, cfg_for(part, top_p=0.5), show_progress=False)


def test_self_prompts_are_deduplicated_and_reported(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    base = hf_generate(model, tok)
    words = tok("How do I sort a list", add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id

    def scripted(prompts, params, seed):  # a target that repeats itself half of the time
        new, stopped = base(prompts, params, seed)
        return [words + ([n[0]] if i % 2 else []) for i, n in enumerate(new)], [True] * len(new)

    cfg = cfg_for(tmp_path, self_prompts=6, batch_size=4, prompt_max_new_tokens=5)
    rows, stats = self_prompts(model, tok, cfg, generate=scripted, show_progress=False)
    keys = [r.turns[0].lower() for r in rows]
    assert len(rows) == len(set(keys)) and rows[0].id == "self-000000" and stats["duplicates"] > 0
    assert eos not in words and all(r.turns[0].startswith("How do I sort a list") for r in rows)
    assert (tmp_path / "prompts.jsonl").is_file()
    again, _ = self_prompts(model, tok, cfg, generate=None, show_progress=False)  # cached, not regenerated
    assert again == rows
    # A random tiny target never ends its question: every candidate is cut off, which is an error.
    with pytest.raises(UserError, match="the target wrote no usable prompts"):
        self_prompts(
            model, tok, cfg_for(tmp_path / "r", self_prompts=2, prompt_max_new_tokens=4), show_progress=False
        )


def test_diversity_counts_distinct_ngrams_and_lengths():
    s = diversity(["a b c", "a b d", "x"])
    assert s["distinct_1"] == round(5 / 7, 4) and s["distinct_2"] == round(3 / 4, 4)
    assert s["length_words"]["min"] == 1 and s["length_words"]["max"] == 3


def test_speculative_distillation_writes_what_plain_generation_writes(tmp_path, tiny_llama):
    """With a drafter (``data.distill.heads``), greedy distillation is token-identical and batched."""
    from draftheads.decode import SpeculativeGenerator
    from draftheads.heads import EagleDrafter

    model, tok, fp = tiny_llama
    drafter = EagleDrafter(fp, target_config=model.config.to_dict(), version=3, draft_vocab_size=500).attach(
        model
    )
    plain = distill(model, tok, PROMPTS, cfg_for(tmp_path / "plain", temperature=0.0), show_progress=False)
    spec = distill(
        model,
        tok,
        PROMPTS,
        cfg_for(tmp_path / "spec", temperature=0.0),
        decode=SpeculativeGenerator(model, drafter, tokenizer=tok).generate,
        show_progress=False,
    )
    assert shards(spec) == shards(plain) and len(shards(plain)) == 3


def test_cut_off_answers_are_marked_unfinished_and_train_without_an_end_of_turn(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    out = distill(
        model, tok, PROMPTS[:3], cfg_for(tmp_path, max_new_tokens=2, temperature=0.0), show_progress=False
    )
    rows = [json.loads(line) for text in shards(out).values() for line in text.splitlines()]
    for r in rows:
        answer = r["messages"][1]
        assert answer["unfinished"] == (r["finish"][0] == "length")
    # The exact span: the answer's own tokens; the template's end-of-turn after it is not trained.
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    for unfinished, trained in ((False, "hello there<|im_end|>"), (True, "hello there")):
        messages = [chat[0], {**chat[1], "unfinished": True} if unfinished else chat[1]]
        ids, mask = encode_chat(tok, messages)
        where = [i for i, m in enumerate(mask) if m]
        assert where == list(range(where[0], where[-1] + 1))  # one contiguous span
        assert tok.decode([ids[i] for i in where]) == trained
        assert len(where) == len(tok(trained, add_special_tokens=False)["input_ids"])
        if unfinished:
            assert tok.convert_ids_to_tokens(ids[where[-1] + 1]) == "<|im_end|>" and not mask[where[-1] + 1]
    # Through the data pipeline, from the distilled shard: the flag survives to the loss mask.
    shard = tmp_path / "one.jsonl"
    shard.write_text(json.dumps({"messages": [chat[0], {**chat[1], "unfinished": True}]}) + "\n")
    ds, _ = prepare_dataset(DataConfig(path=str(shard), min_loss_tokens=1), tok)
    trained_ids = [t for t, m in zip(ds[0]["input_ids"], ds[0]["loss_mask"]) if m]
    assert tok.decode(trained_ids) == "hello there"


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_prompts_longer_than_the_target_positions_are_skipped_and_counted(tmp_path, kind, capsys):
    model, tok = get_target(kind)
    long = PromptRow("long", "test", [" ".join(["word"] * (model.config.max_position_embeddings + 10))])
    out = distill(model, tok, [*PROMPTS[:2], long], cfg_for(tmp_path, max_new_tokens=3), show_progress=False)
    rows = [json.loads(line) for text in shards(out).values() for line in text.splitlines()]
    assert sorted(r["id"] for r in rows) == ["p0", "p1"]
    assert json.loads((out / MANIFEST).read_text())["skipped_too_long"] == 1
    assert "skipped 1 of 3 prompts longer than the target's" in capsys.readouterr().err
    with pytest.raises(UserError, match="every prompt is longer than the target's") as e:
        distill(model, tok, [long], cfg_for(tmp_path / "none", max_new_tokens=3), show_progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "none").exists()


def test_distillation_on_the_fast_backend_writes_byte_identical_greedy_shards(tmp_path, tiny_llama):
    """``data.distill.backend=auto`` (oneDNN-packed weights on a float32 CPU target) changes no byte."""
    from draftheads.decode import backend

    model, tok, _ = tiny_llama
    assert backend.resolve("auto", model.device, model.dtype) == "onednn"
    greedy = dict(temperature=0.0, max_new_tokens=12)
    eager = distill(
        model, tok, PROMPTS, cfg_for(tmp_path / "eager", backend="eager", **greedy), show_progress=False
    )
    fast = distill(
        model,
        tok,
        PROMPTS,
        cfg_for(tmp_path / "fast", **greedy),
        show_progress=False,
        runner=partial(backend.running, "auto"),
    )
    assert shards(fast) == shards(eager) and len(shards(eager)) == 3
    assert not any("forward" in m.__dict__ for m in model.modules())  # the backend is undone after


def test_distilled_rows_keep_their_token_ids_and_the_decode_round_trip_is_counted(tmp_path, tiny_llama):
    model, tok, _ = tiny_llama
    out = distill(model, tok, PROMPTS, cfg_for(tmp_path / "d", temperature=0.0), show_progress=False)
    rows = [json.loads(line) for text in shards(out).values() for line in text.splitlines()]
    for r in rows:
        answers = [m for m in r["messages"] if m["role"] == "assistant"]
        assert [tok.decode(i, skip_special_tokens=True) for i in r["answer_ids"]] == [
            m["content"] for m in answers
        ]
    assert json.loads((out / ROUNDTRIP).read_text())["rows"] == len(PROMPTS)
    # "hello" spelt letter by letter decodes to text that tokenizes as fewer tokens: a changed row
    spelt = [tok.convert_tokens_to_ids(c) for c in "hello"]
    whole = tok("hello", add_special_tokens=False)["input_ids"]
    assert spelt != whole
    (tmp_path / "r").mkdir()
    lines = [json.dumps({"id": i, "answer_ids": [ids]}) for i, ids in enumerate((spelt, whole))]
    (tmp_path / "r" / "shard-00000.jsonl").write_text("\n".join(lines) + "\n")
    counts = roundtrip_changes(tmp_path / "r", tok)
    assert counts["rows"] == 2 and counts["rows_changed"] == 1 and counts["answers_changed"] == 1
    # the five letters are replaced by the whole word's tokens; the unchanged row adds nothing
    assert counts["tokens"] == 5 + len(whole) and counts["tokens_changed"] == 5


def test_rows_distill_cannot_use_are_counted_and_named_as_the_data_command_names_them(
    tmp_path, tokenizer, capsys
):
    """Malformed JSON and an empty answer: each row left out is counted and named; a file saved
    with a byte-order mark is read as its text."""
    from draftheads.data.prompts import prompts_from_config

    def chat(rid: str, answer: str) -> bytes:
        turns = [{"role": "user", "content": f"Question {rid}?"}, {"role": "assistant", "content": answer}]
        return json.dumps({"id": rid, "messages": turns}).encode() + b"\n"

    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + chat("bom", "A")  # saved with a byte-order mark
        + chat("ok1", "B")
        + b'{"id": "torn", "messages": [\n'  # malformed JSON
        + chat("empty", "")  # an empty answer
        + chat("ok2", "C")
    )  # fmt: skip
    prompts = prompts_from_config(DataConfig(path=str(path)))
    err = capsys.readouterr().err
    assert [p.id for p in prompts] == [f"{path}/bom", f"{path}/ok1", f"{path}/ok2"]
    _, report = prepare_dataset(DataConfig(path=str(path), min_loss_tokens=1), tokenizer)
    data = report.sources[0]  # what `draftheads data` reports for the same file
    assert data.skipped == 2 and f"2 skipped, 0 dropped of {data.read} rows" in err
    assert [s.split(": ", 1)[0] for s in data.first_skips] == ["mixed.jsonl:3", "mixed.jsonl:4"]
    assert "invalid JSON" in data.first_skips[0] and "empty messages[1].content" in data.first_skips[1]
    for named in data.first_skips:
        assert f"first skipped row {named}" in err
    for reason, n in data.reasons.items():
        assert f"{n}x {reason}" in err
