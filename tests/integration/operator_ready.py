"""Wait until a `memfit operator` process answers /healthz (the integration tests' operator fixtures)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path


def wait_healthy(port: int, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"operator not healthy:\n{log.read_text()[-3000:]}")
