"""The integration tests' operator: wait until `memfit operator` answers /healthz; the module fixture."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


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


@contextmanager
def module_operator(cluster: Any, kube: Any, request: Any, tmp_path_factory: Any,
                    env: dict[str, str] | None = None) -> Iterator[tuple[Path, int]]:
    """The integration modules' operator: CRDs and the test bed's pools applied, `memfit operator` started
    (with `env` added: chart settings) and healthy; (log, metrics port). On exit it must still be running."""
    from memfit_testbed.operator_helpers import apply_pools, operator_process

    request.getfixturevalue("install_crds")
    apply_pools(kube)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with operator_process(cluster.kubeconfig, log, env=env) as (proc, port):
        wait_healthy(port, log)
        yield log, port
        assert proc.poll() is None, f"operator exited:\n{log.read_text()[-3000:]}"


@pytest.fixture(scope="module")
def operator(cluster: Any, kube: Any, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Path]:
    """A module's operator with the chart's defaults, its log's path (import it where no setting differs)."""
    with module_operator(cluster, kube, request, tmp_path_factory) as (log, _):
        yield log


@pytest.fixture(scope="module", name="operator")
def kueue_operator(cluster: Any, kube: Any, kueue: Any, tmp_path_factory: pytest.TempPathFactory,
                   request: pytest.FixtureRequest) -> Iterator[Path]:
    """`operator` for a Kueue module: the chart's defaults, started once the module's Kueue is running
    (import `kueue_operator`; it registers as `operator`)."""
    with module_operator(cluster, kube, request, tmp_path_factory) as (log, _):
        yield log
