"""Locate the real tools the e2e tier runs (helm, prometheus, promtool) and run them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
CHART = REPO / "charts" / "memfit"
KUBE_VERSION = "1.36.3"  # the test cluster's version (hack/install-testbin.sh); helm's offline default is 1.20


def require_tools() -> bool:
    """`make test` sets MEMFIT_REQUIRE_CLUSTER=1: then a missing tool fails instead of skipping."""
    return os.environ.get("MEMFIT_REQUIRE_CLUSTER", "") not in ("", "0")


def missing(msg: str) -> None:
    if require_tools():
        pytest.fail(f"{msg} (MEMFIT_REQUIRE_CLUSTER is set)", pytrace=False)
    pytest.skip(msg)


def _script_dir(script: str, *args: str) -> Path | None:
    try:
        out = subprocess.run(["bash", str(HACK / script), *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return Path(out.stdout.strip().splitlines()[-1])


def helm_path() -> Path:
    """helm from $MEMFIT_HELM, else the test binaries (hack/install-testbin.sh); skips when absent."""
    env = os.environ.get("MEMFIT_HELM")
    if env:
        return Path(env)
    bin_dir = _script_dir("install-testbin.sh", "--print-dir")
    helm = bin_dir / "helm" if bin_dir else None
    if helm is None or not os.access(helm, os.X_OK):
        missing(f"helm not built ({helm}): run hack/install-testbin.sh")
    assert helm is not None
    return helm


def prometheus_dir() -> Path:
    """prometheus and promtool from Debian (hack/install-prometheus.sh, idempotent, cached outside the repo)."""
    env = os.environ.get("MEMFIT_PROMETHEUS_DIR")
    bin_dir = Path(env) if env else _script_dir("install-prometheus.sh")
    if bin_dir is None or not all(os.access(bin_dir / b, os.X_OK) for b in ("prometheus", "promtool")):
        missing(f"prometheus/promtool not found in {bin_dir}: run hack/install-prometheus.sh")
    assert bin_dir is not None
    return bin_dir


def run(args: list[str | Path], *, check: bool = True, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; on an unexpected exit status fail with its output."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {result.returncode}:\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result
