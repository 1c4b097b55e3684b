"""Run vLLM offline as a serve command would, and write what it generated as JSON.

This file runs in the engine's own environment (``make engine``: vLLM's CPU build in
``.venv-engine``), never in draftheads' one, so it imports nothing of draftheads: it is shipped
in the package as a plain file and started by path, once per serve command, by
:func:`draftheads.bench.engine_acceptance.run_engine` (``draftheads engine`` and the engine
tests):

    ENGINE_PYTHON .../draftheads/bench/engine_job.py JOB.json

``JOB.json`` holds ``command`` (the serve command draftheads printed, e.g. ``vllm serve TARGET
--speculative-config '{...}'`` or ``vllm serve DRAFT``), ``prompts`` (lists of token ids),
``max_tokens``, ``engine`` (this machine's limits, added to the command's arguments) and
``ignore_eos`` (default true: every prompt gets ``max_tokens`` tokens; false: a prompt ends at
the target's end-of-sequence token, as a served request does). The command's model and flags
become the arguments of ``vllm.LLM``, the offline form of the same server (vLLM's own parser
reads the flags). ``result`` names the file that receives one JSON object: ``outputs`` (each
prompt's generated token ids, greedy), ``vllm_version`` and, when the command drafts, ``num_drafts``,
``num_draft_tokens``, ``num_accepted_tokens`` and ``accepted_per_position`` (vLLM's
speculative-decoding counters).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import fields

# Run by path, this file's folder (draftheads' bench package) would lead sys.path, and its module
# names could shadow the ones vLLM imports; vLLM's worker processes inherit the path as cut here.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


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


def main() -> None:
    job = json.loads(open(sys.argv[1]).read())
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    kwargs = engine_kwargs(job["command"])
    kwargs.update(job.get("engine", {}))  # this machine's limits (memory, length), not the drafter's
    llm = LLM(**kwargs, disable_log_stats=False)
    ignore_eos = bool(job.get("ignore_eos", True))
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=ignore_eos)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]], params, use_tqdm=False)
    report = {"outputs": [list(r.outputs[0].token_ids) for r in results], **counters(llm.get_metrics())}
    report["vllm_version"] = vllm.__version__
    with open(job["result"], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":  # vLLM starts worker processes that import this module again
    main()
