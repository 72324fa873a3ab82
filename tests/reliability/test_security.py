"""Security: pods are non-root and restricted whatever the spec says, stay in the job's namespace, and
no secret reaches the operator's logs or the objects it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from memfit_testbed.reliability.chaos import ChaosCluster
from memfit_testbed.reliability.security import (
    REPO,
    builder_violations,
    catalog_pools,
    restricted_run,
    valid_specs,
)

POOLS = catalog_pools()


@settings(max_examples=80, deadline=None)
@given(raw=valid_specs())
def test_every_pod_memfit_builds_is_restricted_and_stays_in_the_namespace(raw: dict[str, Any]) -> None:
    assert builder_violations(raw, POOLS) == []


def test_operator_rbac_has_no_secrets() -> None:
    rules = (REPO / "charts" / "memfit" / "templates" / "_rbac.tpl").read_text()
    resources = [line for line in rules.splitlines() if "resources:" in line]
    assert resources and not [r for r in resources if "secret" in r.lower()]


@pytest.mark.cluster
@pytest.mark.slow
def test_restricted_namespace_runs_jobs_and_nothing_leaks(
    chaos_cluster: ChaosCluster, tmp_path: Path
) -> None:
    """A job in a `restricted` Pod Security namespace runs (its pods are admitted); canary secrets in
    the operator's environment and in a Secret of the namespace appear in no log and no object."""
    found = restricted_run(chaos_cluster, tmp_path / "operator.log")
    assert found["phases"] == ["Succeeded", "Succeeded"], found
    assert found["pods_admitted"] >= 3 and found["jobs"] == 3, found  # profiler + 2 trainers
    assert found["pod_violations"] == [], found
    assert found["secrets_in_objects"] == [] and found["secrets_in_operator_log"] == [], found
    assert found["operator_crashes"] == 0 and found["operator_tracebacks"] == 0, found
