"""Distillation through a serving engine: a real ``transformers serve`` started on loopback.

The server runs a tiny target saved to a temporary folder (SmolLM2 would make the test minutes
long on two CPU cores); the in-process target is the same model, so greedy answers must agree.
Clients reach it through a loopback relay: closing the relay is, to them, the server dying
(answers cut off mid-run, the port refusing), and a new relay is the server back on another
port, without a second start of the server (most of these tests' time).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DistillConfig
from draftheads.conf.schema.heads import TargetConfig
from draftheads.data.distill.roundtrip import ROUNDTRIP
from draftheads.data.distill.run import distill
from draftheads.data.distill.shards import MANIFEST, shard_rows
from draftheads.data.endpoint import (
    EndpointError,
    parse_reply,
    pick_model,
    report_cut_short,
    turn_end,
    until_stop,
)
from draftheads.data.prompts import PromptRow
from draftheads.heads.target.embedded import convert_smollm2
from draftheads.heads.target.load import build_tiny
from tests.conftest import get_target

PROMPTS = [
    PromptRow(f"q{i:02d}", "test", [f"Question {i}: how do I sort a list" + "?" * (i % 4)])
    if i % 7
    else PromptRow(f"q{i:02d}", "multi", [f"First turn {i}", "And the second turn?"])
    for i in range(24)
]
START_S = 120.0
# one worker runs every test here, so the module's server starts once (and once more after the kill)
pytestmark = pytest.mark.xdist_group("served")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either side ends, then end both."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for side in (src, dst):
            with contextlib.suppress(OSError):
                side.shutdown(socket.SHUT_RDWR)


class Relay:
    """A loopback TCP relay on a free port to a server's ``port``."""

    def __init__(self, port: int) -> None:
        self.target, self.conns, self.open = port, [], True
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                if not self.open:
                    client.close()
                    upstream.close()
                    return
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        """Refuse new connections and cut the open ones: to a client, the server died."""
        with self.lock:
            self.open, conns = False, self.conns
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()


class Server:
    """``transformers serve MODEL`` on a free loopback port, started and killed by the test, and
    reached through a :class:`Relay`."""

    def __init__(self, model_dir: Path, log: Path) -> None:
        self.model_dir, self.log, self.proc, self.relay = model_dir, log, None, None

    def start(self) -> int:
        """Start the server; its port, once it answers."""
        port = free_port()
        cmd = [str(Path(sys.executable).with_name("transformers")), "serve", str(self.model_dir)]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32"]
        # one thread, as this test process runs the in-process target: the same kernels, the same sums
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"transformers serve exited: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url + "/models", timeout=1).read()
                return port
            except OSError:
                time.sleep(0.2)
        self.kill()
        pytest.fail(
            f"transformers serve did not answer within {START_S:.0f} s: {self.log.read_text()[-2000:]}"
        )

    def running(self) -> str:
        """The URL of the running server (started when it is not running), on a new port after
        :meth:`drop`."""
        if self.proc is None or self.proc.poll() is not None:
            self.port = self.start()
        if self.relay is None or not self.relay.open:
            self.relay = Relay(self.port)
        return f"http://127.0.0.1:{self.relay.port}/v1"

    def up(self) -> bool:
        """Whether clients reach the server."""
        return self.relay is not None and self.relay.open and self.proc.poll() is None

    def drop(self) -> None:
        """To every client, the server dies: open requests cut off, its port refusing."""
        if self.relay is not None:
            self.relay.close()

    def kill(self) -> None:
        self.drop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module (each start costs seconds); a test that kills it restarts it."""
    model, tok = get_target("llama")
    folder = tmp_path_factory.mktemp("served")
    model.save_pretrained(folder / "target")
    tok.save_pretrained(folder / "target")
    s = Server(folder / "target", folder / "serve.log")
    yield s
    s.kill()


def cfg_for(path, **kw) -> DistillConfig:
    base = dict(out_dir=str(path), max_new_tokens=8, batch_size=4, shard_rows=8, temperature=0.0)
    return DistillConfig(**{**base, **kw})


def rows_by_id(out) -> dict[str, dict]:
    return {r["id"]: r for r in shard_rows(out)}


def lines_in(out: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in out.glob("shard-*.jsonl"))


def kill_after(server: Server, out: Path, rows: int) -> threading.Thread:
    """Drop the server once ``rows`` rows are in the shards: a server dying mid-run."""

    def watch() -> None:
        while server.up() and lines_in(out) < rows:
            time.sleep(0.002)
        server.drop()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_served_distillation_resumes_after_the_server_dies_and_equals_in_process(tmp_path, server, capsys):
    model, tok = get_target("llama")
    served_dir, local_dir = tmp_path / "served", tmp_path / "local"
    url = server.running()
    watcher = kill_after(server, served_dir, rows=4)
    with pytest.raises(UserError) as e:
        distill(
            model,
            tok,
            PROMPTS,
            cfg_for(served_dir, endpoint=url, concurrency=2, retries=1),
            show_progress=False,
        )
    watcher.join()
    msg = str(e.value)
    assert "\n" not in msg and url in msg and "rerun the same command to resume" in msg
    part = rows_by_id(served_dir)
    assert 4 <= len(part) < len(PROMPTS)  # killed mid-run; the finished batches are kept
    # The dead URL is now an unreachable endpoint: one line naming it and the fix, nothing touched.
    before = {p.name: p.read_bytes() for p in served_dir.iterdir()}
    with pytest.raises(UserError, match="start the server there or fix the URL") as e:
        distill(model, tok, PROMPTS, cfg_for(served_dir, endpoint=url), show_progress=False)
    assert url in str(e.value) and "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in served_dir.iterdir()} == before

    url = server.running()  # another port: the manifest does not pin the URL
    capsys.readouterr()
    distill(model, tok, PROMPTS, cfg_for(served_dir, endpoint=url), show_progress=False)
    served = rows_by_id(served_dir)
    assert lines_in(served_dir) == len(PROMPTS) and sorted(served) == sorted(p.id for p in PROMPTS)
    assert all(served[k] == v for k, v in part.items())  # the rows before the kill stay as written
    gen = next(r["gen"] for k, r in served.items() if k not in part)  # a row of the rerun
    assert gen["endpoint"] == url.rstrip("/") and gen["served_model"] == str(server.model_dir)
    assert gen["answer_ids"] == "text"  # transformers serve returns no token ids
    assert json.loads((served_dir / ROUNDTRIP).read_text())["rows_retokenized"] == len(PROMPTS)
    assert "the server's text re-tokenized" in capsys.readouterr().err

    # Greedy answers through the server are the in-process target's own.
    distill(model, tok, PROMPTS, cfg_for(local_dir), show_progress=False)
    local = rows_by_id(local_dir)
    same, n = identical_answers(served, local)
    print(f"served greedy answers identical to in-process: {same:.3f} of {n}")
    assert same == 1.0
    assert all(served[k]["finish"] == local[k]["finish"] for k in local)
    assert json.loads((served_dir / MANIFEST).read_text()) == json.loads((local_dir / MANIFEST).read_text())


def identical_answers(served: dict[str, dict], local: dict[str, dict]) -> tuple[float, int]:
    """The share of assistant answers that are the same text in both runs, and how many there are."""
    pairs = [(s, lo) for k in local for s, lo in zip(served[k]["messages"], local[k]["messages"])]
    answers = [(s, lo) for s, lo in pairs if lo["role"] == "assistant"]
    return sum(s == lo for s, lo in answers) / len(answers), len(answers)


@pytest.mark.slow
def test_the_embedded_smollm2_served_answers_as_in_process(tmp_path, smollm2):
    """Real answers that end their turn: served greedy distillation equals in-process."""
    model, tok = smollm2
    server = Server(convert_smollm2(TargetConfig()), tmp_path / "serve.log")
    prompts = [
        PromptRow("a", "t", ["What is a list in Python?"]),
        PromptRow("b", "t", ["Say hello.", "Now say goodbye."]),
        PromptRow("c", "t", ["Name a colour."]),
        PromptRow("d", "t", ["What is 2 + 2?"]),
    ]
    try:
        url = server.running()
        served = distill(
            model, tok, prompts, cfg_for(tmp_path / "s", endpoint=url, max_new_tokens=24), show_progress=False
        )
    finally:
        server.kill()
    local = distill(model, tok, prompts, cfg_for(tmp_path / "l", max_new_tokens=24), show_progress=False)
    same, n = identical_answers(rows_by_id(served), rows_by_id(local))
    print(f"SmolLM2 served greedy answers identical to in-process: {same:.3f} of {n}")
    assert same == 1.0
    finishes = [f for r in rows_by_id(served).values() for f in r["finish"]]
    assert "stop" in finishes and finishes == [f for r in rows_by_id(local).values() for f in r["finish"]]


def test_a_server_that_is_not_the_target_is_refused_before_anything_is_written(tmp_path, server):
    model, tok = get_target("llama")
    url = server.running()
    with pytest.raises(
        UserError, match=r"data.distill.model=other is not served at .* \(it serves .*target\)"
    ):
        distill(
            model, tok, PROMPTS, cfg_for(tmp_path / "a", endpoint=url, model="other"), show_progress=False
        )
    other = build_tiny("llama", tok, seed=1)  # same architecture and tokenizer, other weights
    with pytest.raises(UserError, match="is not target tiny-llama: its greedy answer to a probe is") as e:
        distill(other, tok, PROMPTS, cfg_for(tmp_path / "b", endpoint=url), show_progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_sampling_settings_reach_the_server_with_a_seed_per_row_and_turn(tmp_path, server):
    """Temperature, top-p and each request's seed pass through: the same seeds give the same
    samples again (one request at a time on a server that seeds per request), unlike greedy."""
    model, tok = get_target("llama")
    url, prompts = server.running(), PROMPTS[:6]
    sampled = dict(endpoint=url, temperature=1.0, top_p=0.9, concurrency=1)
    a = rows_by_id(distill(model, tok, prompts, cfg_for(tmp_path / "a", **sampled), show_progress=False))
    b = rows_by_id(distill(model, tok, prompts, cfg_for(tmp_path / "b", **sampled), show_progress=False))
    greedy = rows_by_id(
        distill(model, tok, prompts, cfg_for(tmp_path / "g", endpoint=url), show_progress=False)
    )
    assert {k: r["messages"] for k, r in a.items()} == {k: r["messages"] for k, r in b.items()}
    assert identical_answers(a, greedy)[0] < 1.0
    assert a["q01"]["gen"]["temperature"] == 1.0 and a["q01"]["gen"]["top_p"] == 0.9


def test_answers_cut_off_by_the_server_are_kept_unfinished_and_named(capsys):
    assert turn_end("stop", 3, 8) == "stop"
    assert turn_end("length", 8, 8) == "length"  # data.distill.max_new_tokens reached
    assert turn_end("length", 5, 8) == "server-length"  # the server's own limit: not a finished turn
    assert turn_end("abort", 2, 8) == "server-abort"
    rows = [{"id": "a", "finish": ["stop", "server-length"]}, {"id": "b", "finish": ["length"]}]
    assert report_cut_short(rows) == 1
    err = capsys.readouterr().err
    assert "1 answers were cut off by the server" in err and "a (server-length)" in err and "\n" == err[-1]


def test_token_ids_are_read_where_the_server_returns_them_and_the_model_is_picked_by_name():
    """vLLM's ``return_token_ids`` answer shape: the answer's ids (its end-of-sequence id cut as
    in-process), the prompt's ids and the usage count; several served models need a name."""
    vllm = {
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "message": {"role": "assistant", "content": "Hi"},
                "finish_reason": "stop",
                "token_ids": [7, 8, 2],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    }
    reply = parse_reply("http://h/v1", vllm)
    assert (reply.text, reply.finish, reply.ids, reply.prompt_ids, reply.tokens) == (
        "Hi",
        "stop",
        [7, 8, 2],
        [1, 2, 3],
        3,
    )
    assert until_stop(reply.ids, [2]) == [7, 8]
    plain = parse_reply(
        "http://h/v1", {"choices": [{"message": {"content": "Hi"}, "finish_reason": "length"}]}
    )
    assert plain.ids is None and plain.prompt_ids is None and plain.tokens is None
    with pytest.raises(EndpointError, match="without choices"):
        parse_reply("http://h/v1", {"object": "error"})
    assert pick_model("u", None, ["only"], "t") == "only" and pick_model("u", None, ["a", "t"], "t") == "t"
    with pytest.raises(
        UserError, match=r"u serves 2 models \(a, b\); name the target's with data.distill.model=NAME"
    ):
        pick_model("u", None, ["a", "b"], "t")


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(endpoint="localhost:8000"), "data.distill.endpoint='localhost:8000' is not a server URL"),
        (dict(endpoint="http://h:port/v1"), "is not a server URL; use http://HOST:PORT/v1"),
        (dict(model="m"), "data.distill.model=m names a served model but data.distill.endpoint is not set"),
        (dict(endpoint="http://h:1/v1", heads="d"), "drop data.distill.heads"),
        (dict(endpoint="http://h:1/v1", concurrency=0), "data.distill.concurrency=0 is out of range"),
        (dict(endpoint="http://h:1/v1", timeout_s=0), "data.distill.timeout_s=0 is out of range"),
        (dict(endpoint="http://h:1/v1", retries=-1), "data.distill.retries=-1 is out of range"),
    ],
)
def test_endpoint_settings_are_checked_when_the_config_is_read(kw, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace("?", r"\?")) as e:
        DistillConfig(**kw)
    assert "\n" not in str(e.value)
