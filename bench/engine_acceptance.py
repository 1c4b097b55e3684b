"""vLLM and draftheads' decoder on the same token ids, counted the same way.

vLLM lives in its own environment (``make engine``: ``.venv-engine``, named by
``DRAFTHEADS_ENGINE_PYTHON``); :func:`run_engine` starts :mod:`draftheads.bench.engine_job`
there by path for one serve command, :func:`run_engines` once for several (one vLLM import, one
engine after another), and both read back the outputs and speculative-decoding counters. :func:`our_counters` runs draftheads' decoder with the same chain on the same ids and
counts its steps as vLLM counts them, so that the two records compare key by key. ``draftheads
engine`` (:mod:`draftheads.bench.engine_compare`) and the engine tests both use these.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

import torch

from draftheads.conf.errors import UserError

INSTALL = "make engine"
JOB = Path(__file__).resolve().with_name("engine_job.py")
REPO = Path(__file__).resolve().parents[1]
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position")
ENGINE_TIMEOUT_S = 1800  # one engine start, load and run on a CPU; a hung start ends here


def engine_python() -> Path:
    """The python of vLLM's environment: ``DRAFTHEADS_ENGINE_PYTHON``, else this checkout's
    ``.venv-engine`` (where ``make engine`` puts it)."""
    return Path(os.environ.get("DRAFTHEADS_ENGINE_PYTHON") or REPO / ".venv-engine" / "bin" / "python")


@cache
def engine_missing(python: Path) -> str | None:
    """Why vLLM cannot run with ``python`` (with the install command), or None."""
    if not python.is_file():
        return f"vLLM is not installed: no {python}; run `{INSTALL}` (or set DRAFTHEADS_ENGINE_PYTHON)"
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"vLLM does not import in {python} ({last}); run `{INSTALL}`"
    return None


def check_engine() -> Path:
    """The engine's python, or a UserError naming ``make engine`` when vLLM is missing there."""
    python = engine_python()
    problem = engine_missing(python)
    if problem:
        raise UserError(problem)
    return python


def failure_line(stderr: str) -> str:
    """The line of a failed engine run that says why: its last error line, else its last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or lines or ["no output"])[-1]


def run_engine(
    command: str,
    prompts: list[list[int]],
    max_tokens: int,
    limits: dict,
    workdir: Path,
    ignore_eos: bool = True,
) -> dict:
    """``command`` (a ``vllm serve`` line) run offline by vLLM on ``prompts``, greedily, with
    ``limits`` (this machine's engine arguments) added: its outputs and counters. The run's log
    is ``workdir/engine.log``; a failed run is one line naming the command and that log."""
    job, result = workdir / "job.json", workdir / "result.json"
    spec = {"command": command, "prompts": prompts, "max_tokens": max_tokens, "engine": limits}
    job.write_text(json.dumps({**spec, "ignore_eos": ignore_eos, "result": str(result)}))
    status, log = start_job(job, workdir, ENGINE_TIMEOUT_S, f"`{command}`")
    if status != 0 or not result.is_file():
        raise UserError(f"vLLM failed on `{command}`: {failure_line(log)} (log: {workdir / 'engine.log'})")
    return json.loads(result.read_text())


def run_engines(
    jobs: list[tuple[str, list[list[int]]]],
    max_tokens: int,
    limits: dict,
    workdir: Path,
    ignore_eos: bool = True,
) -> list[dict]:
    """Each ``(command, prompts)`` of ``jobs`` run as :func:`run_engine` runs one, but all in one
    engine process, one engine after another (vLLM imported once): a report per job, in order.
    A job vLLM failed on reports ``{"error": LINE}`` (what vLLM raised) and the others still run;
    a process that fails as a whole (or leaves a job without a result) is one line naming the
    log, ``workdir/engine.log``."""
    job = workdir / "jobs.json"
    results = [workdir / f"result-{i}.json" for i in range(len(jobs))]
    for r in results:
        r.unlink(missing_ok=True)
    spec = [
        {
            "command": command,
            "prompts": prompts,
            "max_tokens": max_tokens,
            "engine": limits,
            "ignore_eos": ignore_eos,
            "result": str(result),
        }
        for (command, prompts), result in zip(jobs, results)
    ]
    job.write_text(json.dumps({"jobs": spec}))
    what = f"{len(jobs)} serve commands"
    status, log = start_job(job, workdir, ENGINE_TIMEOUT_S * max(1, len(jobs)), what)
    if status != 0 or not all(r.is_file() for r in results):
        raise UserError(f"vLLM failed on {what}: {failure_line(log)} (log: {workdir / 'engine.log'})")
    return [json.loads(r.read_text()) for r in results]


def start_job(job: Path, workdir: Path, timeout_s: int, what: str) -> tuple[int, str]:
    """The job runner started on ``job`` in vLLM's environment: its exit status and its log, which
    it writes to ``workdir/engine.log`` as it goes (a long run of several engines can be watched
    there); a run past ``timeout_s`` is one line (a hung start ends there)."""
    python = check_engine()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    log = workdir / "engine.log"
    try:
        with log.open("w") as out:
            run = subprocess.run(
                [str(python), str(JOB), str(job)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                timeout=timeout_s,
            )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"vLLM ran past {timeout_s} s on {what}; check the machine's load (log: {log})"
        ) from None
    return run.returncode, log.read_text(errors="replace")


def counted(report: dict) -> dict:
    """The counters of a record (vLLM's or ours), without the outputs."""
    return {k: report.get(k) for k in COUNTERS}


def count_steps(depths: list[int], new_tokens: int) -> list[int]:
    """The accepted depths of the steps vLLM counts for one prompt: each step until the prompt
    has its ``new_tokens`` tokens (the first comes from the prefill), with all it accepted."""
    counted_depths, made = [], 1
    for accepted in depths:
        if made >= new_tokens:
            break
        counted_depths.append(accepted)
        made += accepted + 1
    return counted_depths


def our_counters(
    drafter,
    model,
    tok,
    prompts: list[list[int]],
    chain: int,
    new_tokens: int,
    backend: str = "eager",
) -> dict:
    """draftheads' decoder with a chain of ``chain`` drafts, every drafted token verified, on the
    prompts' token ids, greedily: its outputs, and its counters as vLLM counts them.

    vLLM drafts the whole chain up to the last step and counts what it accepts there before it
    cuts the output at ``max_tokens``; draftheads drafts no token past ``max_new_tokens``. So the
    decoder runs ``chain`` tokens further, and its steps are counted as vLLM's
    (:func:`count_steps`). Both stop at the target's end-of-sequence token, counting the step
    that wrote it whole, as vLLM does.
    """
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator

    cfg = DecodeConfig(tree=f"chain{chain}", cost_aware=False, lookup=False, backend=backend, do_sample=False)
    outputs, depths = [], []
    for p in prompts:
        gen = SpeculativeGenerator(model, drafter, tok, cfg)
        ids = torch.tensor([p])
        out = gen.generate(ids, torch.ones_like(ids), max_new_tokens=new_tokens + chain)
        outputs.append(out[0, len(p) : len(p) + new_tokens].tolist())
        depths += count_steps(gen.last_stats.accepted_depths, new_tokens)
    return {
        "outputs": outputs,
        "num_drafts": len(depths),
        "num_draft_tokens": chain * len(depths),
        "num_accepted_tokens": sum(depths),
        "accepted_per_position": [sum(a >= d for a in depths) for d in range(1, chain + 1)],
    }


def greedy_outputs(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The target's own greedy continuation of each prompt (transformers' ``generate``), up to
    and including its end-of-sequence token."""
    outs = []
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
            )
        outs.append(out[0, len(p) :].tolist())
    return outs


def mean_acceptance_length(report: dict) -> float:
    """Tokens per drafting step, ``1 + accepted / drafts`` (vLLM's mean acceptance length)."""
    drafts = report.get("num_drafts") or 0
    return 1.0 + (report.get("num_accepted_tokens") or 0) / drafts if drafts else 1.0
