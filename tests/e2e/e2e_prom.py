"""A real Prometheus (Debian's binary) on 127.0.0.1 for the tests, and the exporter processes it scrapes."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM the process we started, SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fake_exporter(role: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Start tests/e2e/fake_exporters.py ROLE; yields the process and its port."""
    proc = subprocess.Popen([sys.executable, str(HERE / "fake_exporters.py"), role], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"{role} exporter did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield proc, int(line)
    finally:
        stop_process(proc)


@dataclass
class Prometheus:
    """A started prometheus: query it through its HTTP API."""

    url: str
    proc: subprocess.Popen[str]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (HTTP 400 on a parse error fails the test with the message)."""
        try:
            data = self.api("query", query=expr)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{expr}\n{e.read().decode()}") from e
        assert data["resultType"] in ("vector", "scalar"), data
        return list(data["result"]) if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def wait_for(self, what: str, ok: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"timed out waiting for {what}\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)


def scrape_config(jobs: dict[str, list[dict[str, Any]]], rule_files: list[Path]) -> dict[str, Any]:
    """1-second scrapes and rule evaluation; honor_labels as the chart's Service/PodMonitors set it."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": name, "honor_labels": name != "dcgm-exporter", "static_configs": targets}
                           for name, targets in jobs.items()],
    }


@contextlib.contextmanager
def prometheus(bin_dir: Path, workdir: Path, config: dict[str, Any]) -> Iterator[Prometheus]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(bin_dir / "prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        server.wait_for("prometheus ready", lambda: _ready(server.url), timeout=30)
        yield server
    finally:
        stop_process(proc)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False
