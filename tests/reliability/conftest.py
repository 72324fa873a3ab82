"""Fixtures of the reliability tier: a chaos cluster (KWOK simulates every pod; no pod runner) and a
`memfit operator` process scoped to one namespace."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from memfit_testbed import testcluster
from memfit_testbed.reliability.chaos import ChaosCluster


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
