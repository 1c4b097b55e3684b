"""Lookup decoding alone (``heads=none``) accepts at least what transformers' prompt lookup
accepts on the same turns: the same branch length, counted the same way, clock-free."""

from __future__ import annotations

from draftheads.conf.schema.decode import DecodeConfig
from draftheads.data.prompts import PromptRow
from draftheads.decode import SpeculativeGenerator
from draftheads.decode.evaluate import evaluate_prompts
from draftheads.decode.report import summarize

TEXTS = [
    "Repeat this list exactly: apples, pears, plums, cherries, apples, pears, plums, cherries.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nRewrite both functions:",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog",
    "one two three four five one two three four five one two three",
]


def test_lookup_alone_accepts_at_least_what_prompt_lookup_does(tiny_llama):
    model, tok, _ = tiny_llama
    prompts = [PromptRow(f"p{i}", "copy", [t]) for i, t in enumerate(TEXTS)]
    # clock-free: every lookup token is verified, as prompt lookup verifies its whole branch
    gen = SpeculativeGenerator(model, None, tok, DecodeConfig(cost_aware=False, lookup_tokens=10))
    (turns,) = evaluate_prompts(model, tok, {"lookup": gen}, prompts, 48, ["pld"], progress=False).values()
    report = summarize(turns, ["pld"])
    assert report["greedy_identical"] == 1.0
    assert report["pld"]["tau"] > 1.1, report["pld"]  # the turns give prompt lookup something to copy
    assert report["tau"] >= report["pld"]["tau"], (report["tau"], report["pld"])
