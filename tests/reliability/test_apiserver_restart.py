"""kube-apiserver restarted (etcd kept) while jobs run: the operator rides it out, every job completes."""

from __future__ import annotations

from pathlib import Path

import pytest
from memfit_testbed.reliability.chaos import ChaosCluster, new_namespace, operator_for, stop_checked
from memfit_testbed.reliability.outage import run_restarts

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.extended]  # the campaign checks it at every stop: docs/testing.md


def test_jobs_complete_across_apiserver_restarts(chaos_cluster: ChaosCluster, tmp_path: Path) -> None:
    namespace = new_namespace(chaos_cluster, "outage")
    op = operator_for(chaos_cluster, namespace, tmp_path / "operator.log")
    try:
        result = run_restarts(chaos_cluster, namespace, op, restarts=2, long_jobs=2, jobs_between=1)
    finally:
        stop_checked(op)
    summary = result.summary()
    assert result.restarts == 2 and all(s > 0 for s in result.downtime_seconds), summary
    assert not result.operator_restarted, summary
    assert result.report.ok, summary
    assert summary["phases"] == {"Succeeded": result.jobs} and result.jobs == 4, summary
