"""2-rank data-parallel training on CPU (torchrun's launcher, gloo): the ranks keep identical weights.

The launcher takes torchrun's settings from its command line and forks the ranks from a process
that imported the trainer: each rank would spend most of its time importing it otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import datasets
import pytest
import torch

from draftheads.train.engine import free_port

SCRIPT = textwrap.dedent(
    """
    import contextlib, importlib, sys, torch
    torch.set_num_threads(1)
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args
    from draftheads.conf.cli import compose
    from draftheads.train.recipe import TrainRecipe
    # what each rank imports lazily on its way to the first step, imported once before the fork
    for name in ("transformers.models.llama.modeling_llama", "transformers.tokenization_utils_fast",
                 "deepspeed.runtime.zero.muon.muon_optimizer"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)

    def rank(out, rows):
        cfg, _ = compose(["target=tiny-llama", "draft=eagle", "deepspeed=zero2", f"train.output_dir={out}",
                          f"train.rows={rows}", "train.max_steps=3", "train.micro_batch_size=2", "train.lr=3e-3",
                          "train.eval_every=3", "train.save_every=0", "train.eval_rows=2", "train.progress=false"])
        recipe = TrainRecipe(cfg).setup()
        from deepspeed.comm import comm
        assert comm.cdb.shm_comm_op is None  # the CPU all-reduce op is neither built nor loaded
        recipe.train()
        recipe.save()
        torch.save(recipe.drafter.state_dict(), f"{out}/rank{recipe.rank}.pt")

    if __name__ == "__main__":
        port, out, rows = sys.argv[1:]
        argv = ["--nproc_per_node=2", f"--master_port={port}", "--start_method=fork", sys.argv[0]]
        config, _, _ = config_from_args(parse_args(argv))  # torchrun's launch settings
        elastic_launch(config, rank)(out, rows)
    """
)


def run_bounded(cmd: list[str], env: dict[str, str], log, timeout: float) -> int | None:
    """Run ``cmd`` in a session of its own with its output in ``log``; past ``timeout`` the
    whole session (the launcher and every rank it started) is killed and None returned, so a
    hung rank fails the test instead of holding the test run open."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


@pytest.mark.slow
def test_two_rank_data_parallel_keeps_identical_weights(tmp_path):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 2000, (12, 14), generator=g).tolist()
    datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": [[0] * 4 + [1] * 10] * 12}).save_to_disk(
        tmp_path / "rows"
    )
    (tmp_path / "run.py").write_text(SCRIPT)
    ops = tmp_path / "torch_extensions"  # where DeepSpeed would build its CPU op
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(ops)}
    port = str(free_port())  # (port 0 hangs the static rendezvous)
    cmd = [sys.executable, str(tmp_path / "run.py"), port, str(tmp_path / "out"), str(tmp_path / "rows")]
    log = tmp_path / "log.txt"
    assert run_bounded(cmd, env, log, timeout=300) == 0, log.read_text()[-3000:]
    a, b = (torch.load(tmp_path / "out" / f"rank{r}.pt") for r in (0, 1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "out" / "model.safetensors").is_file()
    metrics = (tmp_path / "out" / "metrics.jsonl").read_text()
    assert '"step": 3' in metrics
    # the ranks reduce over gloo: DeepSpeed's shared-memory op (a 40 s build) is never built
    assert not ops.exists() and "built successfully" not in log.read_text()


def test_a_process_starts_deepspeed_without_its_shared_memory_op():
    """DeepSpeed's CPU all-reduce op (a 40 s build where it was never built) serves only its
    tensor-parallel inference: it is not loaded, and the process group reduces without it."""
    if torch.cuda.is_available():
        pytest.skip("the op is DeepSpeed's CPU backend's; a CUDA machine uses NCCL")
    from deepspeed.comm import comm

    from draftheads.train.engine import init_distributed

    assert init_distributed()[1] == 1
    assert comm.cdb.shm_comm_op is None
    t = torch.ones(3)
    comm.all_reduce(t)
    assert t.tolist() == [1.0, 1.0, 1.0]
