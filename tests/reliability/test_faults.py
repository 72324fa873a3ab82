"""Injected faults end in the documented state (docs/reliability.md): retry, re-plan, resume, or Failed
with the reason. KWOK simulates the pods; one test kills a real trainer process (pod runner)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import apply_pools, create_job, operator_process, quickstart, wait_phase
from memfit_testbed.reliability.chaos import (
    ChaosCluster,
    OperatorProcess,
    new_namespace,
    operator_for,
    stop_checked,
)
from memfit_testbed.reliability.crash import make_roomy
from memfit_testbed.reliability.faults import KWOK_FAULTS, consistent, plan_configmap_deleted

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.extended]  # the campaign checks it at every stop: docs/testing.md


@pytest.fixture(scope="module")
def fault_namespace(
    chaos_cluster: ChaosCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, OperatorProcess]]:
    make_roomy(chaos_cluster)
    namespace = new_namespace(chaos_cluster, "faults")
    op = operator_for(chaos_cluster, namespace, tmp_path_factory.mktemp("faults") / "operator.log")
    yield namespace, op
    assert consistent(chaos_cluster, namespace) == []
    stop_checked(op)


# Since issue 27's read saving, a running attempt's pass reads its plan ConfigMap only while a pod waits to
# start, so a ConfigMap deleted under running pods is rebuilt when a pod next needs it, not within this
# scenario's 32 s (docs/reliability.md, Results: the campaign reports it 8/9). The scenario and the
# campaign's expectation live in the measured test bed; until either changes, this case is skipped here
# (its job would be left running and fail the module's consistency check).
KNOWN_CHANGED = {"plan-configmap-deleted": "rebuilt when a pod needs it since the read saving (docs/reliability.md)"}


@pytest.mark.parametrize("fault", [
    pytest.param(f, marks=pytest.mark.skip(reason=KNOWN_CHANGED[f])) if f in KNOWN_CHANGED else f
    for f in sorted(KWOK_FAULTS)])
def test_fault_ends_in_the_documented_state(
    chaos_cluster: ChaosCluster, fault_namespace: tuple[str, OperatorProcess], fault: str
) -> None:
    namespace, _ = fault_namespace
    scenario = KWOK_FAULTS[fault]
    result = (
        plan_configmap_deleted(chaos_cluster, namespace, 1.0)
        if scenario is plan_configmap_deleted
        else scenario(chaos_cluster, namespace)
    )
    assert result.ok, result.summary()


def _trainer_pid(pod: dict[str, Any]) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        container_id = str(status.get("containerID") or "")
        if container_id.startswith("memfit-local://") and (status.get("state") or {}).get("running"):
            return int(container_id.removeprefix("memfit-local://"))
    return None


def test_real_trainer_killed_is_retried_and_succeeds(
    cluster: Any, kube: Kube, namespace: str, install_crds: list[str], tmp_path: Path
) -> None:
    """SIGKILL the real trainer process (pod runner): the Job retries the pod, the attempt succeeds."""
    apply_pools(kube)
    doc = quickstart("killed", training={"globalBatchSize": 8, "maxSteps": 400, "optimizer": "adamw"})
    with operator_process(cluster.kubeconfig, tmp_path / "operator.log", "--namespace", namespace):
        create_job(kube, namespace, doc)
        selector = "memfit.dev/job=killed,memfit.dev/component=trainer"
        pid = kube.wait(
            "a running trainer process",
            lambda: next((p for p in (_trainer_pid(x) for x in kube.pods(namespace, selector)) if p), None),
            timeout=300,
        )
        time.sleep(2.0)  # a few steps in
        os.kill(pid, signal.SIGKILL)
        job = wait_phase(kube, namespace, "killed", ("Succeeded", "Failed"), 420, tmp_path / "operator.log")
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert [a["outcome"] for a in status["attempts"]] == ["Succeeded"], status
    train = kube.raw(kube.batch.read_namespaced_job, "killed-train-0", namespace) or {}
    assert int((train.get("status") or {}).get("failed") or 0) == 1, train.get("status")
    pods = kube.pods(namespace, selector)
    assert len(pods) == 2 and sorted(p["status"]["phase"] for p in pods) == ["Failed", "Succeeded"]
