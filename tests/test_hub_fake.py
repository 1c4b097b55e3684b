"""A loopback stand-in for the Hugging Face Hub: the endpoints huggingface_hub uses to create a
repo, create a branch, upload (preupload + NDJSON commit, every file "regular") and download
(repo info, tree listing, HEAD/GET ``resolve`` with X-Repo-Commit and ETag). It binds
127.0.0.1 only, keeps everything in memory and records the Authorization headers it saw."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

MAX_BODY = 64 * 1024 * 1024  # bounded: tests push tiny checkpoints


@dataclass
class Repo:
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit sha
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> {path: content}

    def resolve(self, revision: str) -> str | None:
        revision = unquote(revision)
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """``with FakeHub() as hub: hub.url`` — a threaded HTTP server on an ephemeral loopback port."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.auth_headers: list[str] = []
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits for the serving loop's next poll: every 0.05 s, not the default 0.5 s
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def new_commit(self, repo: Repo, branch: str, files: dict[str, bytes]) -> str:
        parent = repo.commits.get(repo.branches.get(branch, ""), {})
        content = {**parent, **files}
        sha = hashlib.sha1(
            json.dumps(sorted((p, git_blob_sha(b)) for p, b in content.items())).encode()
            + str(len(repo.commits)).encode()
        ).hexdigest()
        repo.commits[sha] = content
        repo.branches[branch] = sha
        return sha

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            # ---- plumbing ----
            def body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                if n > MAX_BODY:
                    raise ValueError("body too large")
                if n:
                    return self.rfile.read(n)
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(chunks)
                return b""

            def send(
                self, status: int, payload=None, headers: dict[str, str] | None = None, head: bool = False
            ):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                if not isinstance(payload, bytes):
                    self.send_header("Content-Type", "application/json")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def not_found(self, what: str, head: bool = False, code: str = "RepoNotFound"):
                self.send(404, {"error": f"{what} not found"}, {"X-Error-Code": code}, head=head)

            def route(self, method: str) -> None:
                path = urlsplit(self.path).path
                with hub.lock:
                    hub.requests.append(f"{method} {path}")
                    if auth := self.headers.get("Authorization"):
                        hub.auth_headers.append(auth)
                try:
                    self.dispatch(method, path)
                except (ValueError, KeyError, json.JSONDecodeError) as e:
                    self.send(400, {"error": str(e)})

            def do_GET(self):
                self.route("GET")

            def do_HEAD(self):
                self.route("HEAD")

            def do_POST(self):
                self.route("POST")

            # ---- endpoints ----
            def dispatch(self, method: str, path: str) -> None:
                parts = [unquote(p) for p in path.strip("/").split("/")]
                if method == "POST" and path == "/api/repos/create":
                    req = json.loads(self.body())
                    repo_id = (
                        f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    )
                    with hub.lock:
                        if repo_id in hub.repos:
                            return self.send(
                                409,
                                {
                                    "error": "You already created this model repo",
                                    "url": f"{hub.url}/{repo_id}",
                                },
                            )
                        private = bool(req.get("private")) or req.get("visibility") == "private"
                        repo = hub.repos[repo_id] = Repo(private=private)
                        hub.new_commit(repo, "main", {".gitattributes": b"*.safetensors filter=lfs\n"})
                    return self.send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id, "id": repo_id})
                if method == "POST" and path == "/api/validate-yaml":
                    self.body()
                    return self.send(200, {"errors": [], "warnings": []})
                if parts[:2] == ["api", "models"] and len(parts) >= 6:
                    repo_id, action, rev = f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[5:])
                    repo = hub.repos.get(repo_id)
                    if repo is None:
                        self.body()
                        return self.not_found(repo_id)
                    return self.api(method, repo_id, repo, action, rev)
                if method in ("GET", "HEAD") and len(parts) >= 5 and parts[2] == "resolve":
                    return self.resolve(method, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
                self.not_found(path, head=method == "HEAD", code="EntryNotFound")

            def api(self, method: str, repo_id: str, repo: Repo, action: str, rev: str) -> None:
                if method == "POST" and action == "branch":
                    self.body()
                    with hub.lock:
                        if rev in repo.branches:
                            return self.send(409, {"error": "Reference already exists"})
                        repo.branches[rev] = repo.branches["main"]
                    return self.send(200, {})
                if method == "POST" and action == "preupload":
                    req = json.loads(self.body())
                    files = [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                        for f in req["files"]
                    ]
                    return self.send(200, {"files": files, "commitOid": repo.resolve(rev)})
                if method == "POST" and action == "commit":
                    files = {}
                    for line in self.body().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                        elif item["key"] != "header":
                            raise ValueError(f"unsupported commit entry {item['key']}")
                    with hub.lock:
                        if unquote(rev) not in repo.branches:
                            return self.not_found(rev, code="RevisionNotFound")
                        sha = hub.new_commit(repo, unquote(rev), files)
                    return self.send(
                        200,
                        {
                            "commitUrl": f"{hub.url}/{repo_id}/commit/{sha}",
                            "commitOid": sha,
                            "pullRequestUrl": None,
                        },
                    )
                sha = repo.resolve(rev.split("/")[0])
                if sha is None:
                    return self.not_found(rev, code="RevisionNotFound")
                content = repo.commits[sha]
                if method == "GET" and action == "revision":
                    siblings = [{"rfilename": p, "size": len(b)} for p, b in sorted(content.items())]
                    return self.send(
                        200,
                        {
                            "id": repo_id,
                            "modelId": repo_id,
                            "sha": sha,
                            "private": repo.private,
                            "siblings": siblings,
                            "tags": [],
                            "downloads": 0,
                            "likes": 0,
                        },
                    )
                if method == "GET" and action == "tree":
                    entries = [
                        {"type": "file", "path": p, "size": len(b), "oid": git_blob_sha(b)}
                        for p, b in sorted(content.items())
                    ]
                    return self.send(200, entries)
                self.not_found(action, code="EntryNotFound")

            def resolve(self, method: str, repo_id: str, rev: str, filename: str) -> None:
                head = method == "HEAD"
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self.not_found(repo_id, head=head)
                sha = repo.resolve(rev)
                if sha is None:
                    return self.not_found(rev, head=head, code="RevisionNotFound")
                data = repo.commits[sha].get(filename)
                headers = {"X-Repo-Commit": sha}
                if data is None:
                    return self.send(
                        404,
                        {"error": "Entry not found"},
                        {**headers, "X-Error-Code": "EntryNotFound"},
                        head=head,
                    )
                headers["ETag"] = f'"{git_blob_sha(data)}"'
                self.send(200, data, {**headers, "Content-Type": "application/octet-stream"}, head=head)

        return Handler


# ---- the fake speaks the protocol: plain huggingface_hub calls against it -----------------------
def serve_hub(monkeypatch, tmp_path) -> FakeHub:
    """Start a FakeHub and point huggingface_hub at it (endpoint, fresh cache, online, a token)."""
    from huggingface_hub import constants

    hub = FakeHub().__enter__()
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return hub


def test_fake_hub_round_trips_with_plain_huggingface_hub(monkeypatch, tmp_path):
    from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download, snapshot_download

    hub = serve_hub(monkeypatch, tmp_path)
    try:
        api = HfApi()
        api.create_repo("org/x", exist_ok=True)
        api.create_repo("org/x", exist_ok=True)  # 409 is accepted
        api.create_commit("org/x", [CommitOperationAdd("a.bin", b"\x00\x01" * 10)], commit_message="add")
        local = snapshot_download("org/x")
        assert open(f"{local}/a.bin", "rb").read() == b"\x00\x01" * 10
        assert open(hf_hub_download("org/x", "a.bin"), "rb").read() == b"\x00\x01" * 10
    finally:
        hub.__exit__(None, None, None)
