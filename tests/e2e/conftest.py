"""e2e tier fixtures: the real helm, prometheus and promtool binaries (built or unpacked outside the repo)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_tools import helm_path, prometheus_dir


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_path()


@pytest.fixture(scope="session")
def prom_bin() -> Path:
    return prometheus_dir()
