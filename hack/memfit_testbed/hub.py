"""A stand-in for the Hugging Face Hub on 127.0.0.1: model repositories served from local folders.

It answers the calls `huggingface_hub` makes for `snapshot_download` and `from_pretrained` (the same
ones a hub mirror answers), so that the trainer's download step runs as it would against the hub,
with HF_ENDPOINT pointing here:

- `GET /api/models/<repo>[/revision/<rev>]`: the repository's commit and files;
- `GET /api/models/<repo>/tree/<rev>[/<path>]`: the file listing (`recursive=true`);
- `HEAD|GET /<repo>/resolve/<rev>/<path>`: a file, with the hub's X-Repo-Commit and ETag headers.

A repository may require a token (`Authorization: Bearer <token>`): without the right one the server
answers 401 like the hub does for a private or gated repository. Every request is recorded (path and
whether it carried the token) for the tests to check who asked for what; the token is never recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

REVISION = "main"


@dataclass
class HubRepo:
    """One model repository: a folder (a save_pretrained directory) at one commit."""

    folder: Path
    token: str | None = None  # required bearer token; None = public
    commit: str = ""

    def __post_init__(self) -> None:
        if not self.commit:
            digest = hashlib.sha1()
            for path in self.files():
                digest.update(path.encode())
                digest.update((self.folder / path).read_bytes())
            self.commit = digest.hexdigest()

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file())


@dataclass
class HubRequest:
    method: str
    path: str
    authorized: bool  # carried the repository's token (or the repository needs none)


@dataclass
class StandInHub:
    """The server: `repos` by id (`org/name`); `requests` in arrival order."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    requests: list[HubRequest] = field(default_factory=list)
    endpoint: str = ""
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                hub._serve(self, head=True)

            def do_GET(self) -> None:
                hub._serve(self, head=False)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="stand-in-hub").start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.endpoint

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def file_requests(self, repo: str) -> list[HubRequest]:
        """The GETs of files of `repo` (downloads, not metadata)."""
        with self._lock:
            return [r for r in self.requests if r.method == "GET" and r.path.startswith(f"/{repo}/resolve/")]

    # --- serving ---------------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler, *, head: bool) -> None:
        url = urlparse(handler.path)
        path = unquote(url.path)
        repo_id, kind, rest = self._route(path)
        repo = self.repos.get(repo_id) if repo_id else None
        auth = handler.headers.get("Authorization", "")
        authorized = repo is not None and (repo.token is None or auth == f"Bearer {repo.token}")
        with self._lock:
            self.requests.append(HubRequest(handler.command, path, authorized))
        if repo is not None and auth and not authorized:
            # Like the hub: a token it does not accept is refused as such.
            self._send(handler, 401, {"error": "Invalid credentials in Authorization header"}, head=head,
                       headers={"X-Error-Message": "Invalid credentials in Authorization header"})  # fmt: skip
            return
        if repo is None or not authorized:
            # The hub answers an unknown repository and a private one without a token alike.
            self._send(handler, 401, {"error": "Repository not found"}, head=head,
                       headers={"X-Error-Code": "RepoNotFound"})  # fmt: skip
            return
        revision, _, file_path = rest.partition("/")
        if revision not in (REVISION, repo.commit):
            self._send(handler, 404, {"error": f"Invalid rev id: {revision}"}, head=head,
                       headers={"X-Error-Code": "RevisionNotFound"})  # fmt: skip
            return
        if kind == "info":
            siblings = [{"rfilename": f} for f in repo.files()]
            public_id = repo_id.removeprefix("datasets/")
            self._send(handler, 200, {"id": public_id, "modelId": public_id, "sha": repo.commit, "private": repo.token
                                      is not None, "siblings": siblings, "cardData": {}, "tags": []}, head=head)  # fmt: skip
        elif kind == "tree":
            recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
            self._send(handler, 200, self._tree(repo, file_path, recursive=recursive), head=head)
        elif kind == "paths-info":
            length = int(handler.headers.get("Content-Length") or 0)
            form = parse_qs(handler.rfile.read(length).decode()) if length else {}
            wanted = set(form.get("paths", []))
            entries = [e for e in self._tree(repo, "", recursive=True) if e["path"] in wanted]
            self._send(handler, 200, entries, head=head)
        else:
            self._send_file(handler, repo, file_path, head=head)

    @staticmethod
    def _route(path: str) -> tuple[str, str, str]:
        """(repo key, info|tree|resolve, `<rev>[/<path>]`), or ('', '', '') for anything else. A model's
        key is its id (`org/name`), a dataset's `datasets/org/name`."""
        parts = path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("models", "datasets"):
            repo = "/".join(parts[2:4]) if parts[1] == "models" else "datasets/" + "/".join(parts[2:4])
            if len(parts) == 4:
                return repo, "info", REVISION
            if parts[4] == "revision" and len(parts) == 6:
                return repo, "info", parts[5]
            if parts[4] in ("tree", "paths-info") and len(parts) >= 6:
                return repo, parts[4], "/".join(parts[5:])
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            return "/".join(parts[:3]), "resolve", "/".join(parts[4:])
        if len(parts) >= 5 and parts[2] == "resolve":
            return "/".join(parts[:2]), "resolve", "/".join(parts[3:])
        return "", "", ""

    @staticmethod
    def _tree(repo: HubRepo, prefix: str, *, recursive: bool) -> list[dict[str, Any]]:
        entries = []
        for name in repo.files():
            if prefix and not name.startswith(prefix.rstrip("/") + "/"):
                continue
            if not recursive and "/" in name.removeprefix(prefix.rstrip("/") + "/" if prefix else ""):
                continue
            data = (repo.folder / name).read_bytes()
            entries.append({"type": "file", "path": name, "size": len(data), "oid": _blob_id(data)})
        return entries

    @staticmethod
    def _send_file(handler: BaseHTTPRequestHandler, repo: HubRepo, name: str, *, head: bool) -> None:
        target = (repo.folder / name).resolve()
        if not name or repo.folder.resolve() not in target.parents or not target.is_file():
            StandInHub._send(handler, 404, {"error": "Entry not found"}, head=head,
                             headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit})  # fmt: skip
            return
        data = target.read_bytes()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("X-Repo-Commit", repo.commit)
        handler.send_header("ETag", f'"{_blob_id(data)}"')
        handler.end_headers()
        if not head:
            handler.wfile.write(data)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, code: int, body: object, *, head: bool,
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
        data = json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if not head:
            handler.wfile.write(data)


def _blob_id(data: bytes) -> str:
    """git's blob id (what the hub reports as a file's oid and ETag for a regular file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@contextlib.contextmanager
def stand_in_hub(repos: dict[str, HubRepo]) -> Iterator[StandInHub]:
    """The server started on 127.0.0.1 with `repos`, stopped on exit."""
    hub = StandInHub(repos=dict(repos))
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


PRIVATE_MODEL = "memfit-test/tiny-llama"
PRIVATE_DATASET = "memfit-test/corpus"


def private_finetune_repos(volumes: Path, corpus: Path, token: str) -> dict[str, HubRepo]:
    """The fine-tune fixtures (memfit_testbed.finetune_data volumes) as private hub repositories: the tiny
    Llama as model PRIVATE_MODEL and its corpus as dataset PRIVATE_DATASET (train / validation splits by
    file name, as on the hub, written into the empty folder `corpus`), both served only with `token`."""
    from memfit_testbed.finetune_data import MODEL_CLAIM, MODEL_PATH

    (corpus / "train.jsonl").write_bytes((volumes / "data" / "train.jsonl").read_bytes())
    (corpus / "validation.jsonl").write_bytes((volumes / "data" / "eval.jsonl").read_bytes())
    return {PRIVATE_MODEL: HubRepo(volumes / MODEL_CLAIM / MODEL_PATH, token=token),
            f"datasets/{PRIVATE_DATASET}": HubRepo(corpus, token=token)}  # fmt: skip
