"""vLLM serves an MTP head exported in EAGLE-1's layout (``format=vllm``, method ``eagle``) as
draftheads drafts it: the same greedy output as the target's own, and the same acceptance
counters (drafting steps, accepted tokens, accepted per chain position) as draftheads' decoder
running the same chain on the same token ids.

Marked ``engine`` (``make test-engine``; vLLM's CPU build in ``.venv-engine``). It is
tests/test_engine.py's case for one more kind, on its target, prompts and engine limits
(imported from there): the head is trained by draftheads' own objective on the target's text
t -> t + 1 until every chain position is accepted sometimes and rejected sometimes.
"""

from __future__ import annotations

import pytest

from draftheads.bench.engine_acceptance import counted, our_counters, run_engines
from draftheads.conf.schema.heads import DraftConfig
from tests import test_engine
from tests.test_engine import (
    CHAIN,
    ENGINE,
    NEW,
    PROMPTS,
    every_position_decides,
    export_command,
    greedy,
    report_of,
    trained,
)

# tests/test_engine.py's fixtures, as this module's: its target, and the skip where vLLM is missing
target, needs_engine = test_engine.target, test_engine.needs_engine

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def mtp(target, tmp_path_factory):
    """An MTP head of CHAIN steps, its layer started as the target's last: 46 steps leave every
    chain position deciding both ways (from about 36 to past 58 they do, on this target)."""
    draft = DraftConfig.of(kind="mtp", num_speculative_steps=CHAIN, init_from_target=True)
    return trained(target, draft, steps=46, lr=3e-3, out=tmp_path_factory.mktemp("mtp") / "drafter")


@pytest.fixture(scope="module")
def served(target, mtp, tmp_path_factory) -> dict:
    """vLLM's report for the head's ``format=vllm`` export, served as its export printed."""
    work = tmp_path_factory.mktemp("served-mtp")
    command = export_command(mtp[1], "vllm", work / "mtp-vllm", target[0])
    assert command.startswith("vllm serve ") and '"method": "eagle"' in command
    return run_engines([(command, PROMPTS)], NEW, ENGINE, work)[0]


def test_vllm_serves_the_mtp_export_with_draftheads_counters(target, mtp, served):
    _, model, tok = target
    drafter, _ = mtp
    ours = our_counters(drafter, model, tok, PROMPTS, CHAIN, NEW)
    assert ours["outputs"] == greedy(model)
    assert every_position_decides(ours)
    report = report_of({"mtp-vllm": served}, "mtp-vllm")
    assert report["outputs"] == greedy(model)
    assert counted(report) == counted(ours)
