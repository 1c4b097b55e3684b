"""The CPU compile benchmark runs end to end and its compiled step computes what the eager one does."""

from __future__ import annotations

import re

from bench.lab import compile_cpu


def test_compile_cpu_prints_a_row_per_size_with_a_matching_compiled_step(capsys):
    argv = ["--target", "tiny-llama", "--compiler", "aot_eager", "--sizes", "1,4", "--context", "32"]
    assert compile_cpu.main([*argv, "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(r.split("|")[1]) for r in rows] == [1, 4]
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert all(float(c.rstrip("×")) > 0 for c in cells[1:6])
        assert float(cells[6]) < 1e-4  # the compiled step's logits are the eager step's
