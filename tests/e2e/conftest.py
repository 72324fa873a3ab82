"""e2e tier fixtures: the real helm, prometheus and promtool binaries (built or unpacked outside the repo) and
the local test cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, start_cluster
from e2e_tools import helm_path, prometheus_dir


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_path()


@pytest.fixture(scope="session")
def prom_bin() -> Path:
    return prometheus_dir()


@pytest.fixture(scope="session")
def e2e_cluster(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A local control plane with KWOK GPU pools and the local pod runner, started once for the e2e tier."""
    with start_cluster(tmp_path_factory.mktemp("e2e-cluster")) as started:
        yield Cluster(kubeconfig=started.kubeconfig, helm=helm)
