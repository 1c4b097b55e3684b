"""Run vLLM offline as a serve command would, and write what it generated as JSON.

This file runs in the engine's own environment (``make engine``: vLLM's CPU build in
``.venv-engine``), never in draftheads' one, so it imports nothing of draftheads: it is shipped
in the package as a plain file and started by path, once per job file, by
:func:`draftheads.bench.engine_acceptance.run_engine` (one serve command: ``draftheads engine``
and the engine tests) and :func:`~draftheads.bench.engine_acceptance.run_engines` (several):

    ENGINE_PYTHON .../draftheads/bench/engine_job.py JOB.json

``JOB.json`` holds one job, or ``{"jobs": [job, ...]}``: several run one after another in this
one process, so vLLM is imported once, and each engine is shut down and its memory freed before
the next starts (an engine start costs minutes on a CPU; the import is a good part of it). A job
holds ``command`` (the serve command draftheads printed, e.g. ``vllm serve TARGET
--speculative-config '{...}'`` or ``vllm serve DRAFT``), ``prompts`` (lists of token ids),
``max_tokens``, ``engine`` (this machine's limits, added to the command's arguments) and
``ignore_eos`` (default true: every prompt gets ``max_tokens`` tokens; false: a prompt ends at
the target's end-of-sequence token, as a served request does). The command's model and flags
become the arguments of ``vllm.LLM``, the offline form of the same server (vLLM's own parser
reads the flags). ``result`` names the file that receives one JSON object: ``outputs`` (each
prompt's generated token ids, greedy), ``vllm_version`` and, when the command drafts, ``num_drafts``,
``num_draft_tokens``, ``num_accepted_tokens`` and ``accepted_per_position`` (vLLM's
speculative-decoding counters). A lone job that fails ends the process with vLLM's error; in a
list, a failed job's result is ``{"error": LINE}`` (the exception vLLM raised, in one line) and
the next job still runs, so one architecture vLLM refuses costs the others nothing.
"""

from __future__ import annotations

import gc
import json
import os
import shlex
import sys
import traceback
from dataclasses import fields

# Run by path, this file's folder (draftheads' bench package) would lead sys.path, and its module
# names could shadow the ones vLLM imports; vLLM's worker processes inherit the path as cut here.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
# The engine runs in this process (no engine-core process, no worker process, "uni" executor
# below): each of those would start Python and import vLLM and torch again, most of an engine
# start on a CPU. The same kernels run either way, so the counters do not depend on it.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def engine_kwargs(command: str) -> dict:
    """``vllm serve MODEL --flag value ...`` as ``vllm.LLM`` keyword arguments, parsed by vLLM's
    own serve argument parser, so a flag it would reject is rejected here too."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = shlex.split(command)
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
        raise SystemExit(f"not a vllm serve command: {command}")
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", argv[2], *argv[3:]])
    engine = EngineArgs.from_cli_args(args)
    defaults = EngineArgs(model=argv[2])
    return {
        f.name: getattr(engine, f.name)
        for f in fields(EngineArgs)
        if getattr(engine, f.name) != getattr(defaults, f.name) or f.name == "model"
    }


def counters(metrics) -> dict:
    """vLLM's speculative-decoding counters from ``LLM.get_metrics()``."""
    names = {
        "vllm:spec_decode_num_drafts": "num_drafts",
        "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    }
    out: dict = {}
    for m in metrics:
        if m.name in names:
            out[names[m.name]] = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_position"] = [int(v) for v in m.values]
    return out


def run_job(job: dict) -> dict:
    """One job (module docstring) run by a fresh ``vllm.LLM``: its outputs and counters. The
    engine is shut down before this returns, so the next job's engine finds its memory free."""
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    kwargs = engine_kwargs(job["command"])
    kwargs.update(job.get("engine", {}))  # this machine's limits (memory, length), not the drafter's
    kwargs.setdefault("distributed_executor_backend", "uni")
    llm = LLM(**kwargs, disable_log_stats=False)
    try:
        ignore_eos = bool(job.get("ignore_eos", True))
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=ignore_eos)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
        results = llm.generate(prompts, params, use_tqdm=False)
        report = {"outputs": [list(r.outputs[0].token_ids) for r in results], **counters(llm.get_metrics())}
        report["vllm_version"] = vllm.__version__
        return report
    finally:
        release(llm)


def release(llm) -> None:
    """Shut down ``llm``'s engine and free what it held, its torch process group included, so
    that the next engine in this process starts as in a fresh one."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def one_line(e: BaseException) -> str:
    """An exception as the one line a failed job's result holds: its type and first line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    if "jobs" not in spec:  # one job: its failure is the process's
        report = run_job(spec)
        with open(spec["result"], "w") as f:
            json.dump(report, f)
        return
    for job in spec["jobs"]:
        try:
            report = run_job(job)
        except Exception as e:  # noqa: BLE001 - recorded for the caller, the next job still runs
            print(f"job {job['command']!r} failed", file=sys.stderr, flush=True)
            traceback.print_exc()
            report = {"error": one_line(e)}
        with open(job["result"], "w") as f:
            json.dump(report, f)


if __name__ == "__main__":  # vLLM starts worker processes that import this module again
    main()
