"""Fixtures of the reliability tier: a chaos cluster (KWOK simulates every pod; no pod runner) and a
`memfit operator` process scoped to one namespace."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import testcluster  # noqa: E402  (hack/ is on sys.path via tests/conftest.py)
from chaos import ChaosCluster  # noqa: E402


@pytest.fixture(scope="session")
def chaos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosCluster]:
    """A second local cluster whose KWOK stages simulate the profiler, OOMs and running trainers."""
    try:
        missing = testcluster.missing_binaries(testcluster.find_bin_dir())
    except (OSError, subprocess.CalledProcessError) as error:
        missing = [f"bin dir ({error})"]
    if missing:
        message = f"test cluster binaries missing: {missing}; run hack/install-testbin.sh"
        if os.environ.get("MEMFIT_REQUIRE_CLUSTER", "") not in ("", "0"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    cc = ChaosCluster(tmp_path_factory.mktemp("chaos"))
    cc.start()
    try:
        yield cc
    finally:
        cc.stop()
