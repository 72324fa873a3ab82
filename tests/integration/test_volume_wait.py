"""A job whose pods wait for their checkpoint claim, through the real scheduler and PV controller: the job
says WaitingForVolume naming the claim and is not re-planned past capacityTimeoutSeconds (another pool
cannot bind a claim); once a volume binds the claim the pod is scheduled and the job Succeeds on its
first attempt."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, get_job, quickstart, wait_phase
from operator_ready import operator

__all__ = ["operator"]  # the module operator fixture, imported
pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 300.0
JOB = "claim-wait"
CLAIM = "slow-checkpoints"
NOBODY = "memfit-test-unprovisioned"  # no provisioner serves this class: the claim waits for the test's volume
CAPACITY_TIMEOUT = 10



def _running(kube: Kube, namespace: str) -> dict[str, Any] | None:
    job = get_job(kube, namespace, JOB) or {}
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == "Running"), None)


def _waiting_pod(kube: Kube, namespace: str) -> dict[str, Any] | None:
    for pod in kube.pods(namespace, f"memfit.dev/job={JOB},memfit.dev/component=trainer"):
        for cond in pod["status"].get("conditions") or []:
            if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return pod
    return None


def test_a_pod_waiting_for_its_claim_is_not_replanned_and_runs_once_the_claim_is_bound(
    cluster: Any, kube: Kube, namespace: str, operator: Path
) -> None:
    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": NOBODY,
                 "resources": {"requests": {"storage": "10Gi"}}},
    })  # fmt: skip
    training = {"globalBatchSize": 8, "maxSteps": 20, "optimizer": "adamw", "learningRate": 0.001,
                "checkpoint": {"volumeClaim": CLAIM}}  # fmt: skip
    create_job(kube, namespace, quickstart(JOB, training=training,
                                           recovery={"maxReplans": 3, "capacityTimeoutSeconds": CAPACITY_TIMEOUT}))
    said = kube.wait("WaitingForVolume", lambda: (c := _running(kube, namespace)) and
                     c["reason"] == "WaitingForVolume" and c, timeout=TIMEOUT)  # fmt: skip
    assert f"for {CLAIM} to be bound" in said["message"], said
    assert "unbound immediate PersistentVolumeClaims" in said["message"], said

    # Three capacity timeouts of waiting (the operator passes every second): the old rule re-planned
    # after one. Nothing memfit does can end this wait sooner; the assertions are on what it did not do.
    pod = _waiting_pod(kube, namespace)
    assert pod is not None
    time.sleep(3 * CAPACITY_TIMEOUT)
    job = get_job(kube, namespace, JOB) or {}
    attempts = job["status"]["attempts"]
    assert [a["outcome"] for a in attempts] == ["Launching"], attempts
    assert (_running(kube, namespace) or {}).get("reason") == "WaitingForVolume"

    volume = f"pv-{namespace}-{CLAIM}"[:63]
    kube.core.create_persistent_volume({
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": NOBODY,
                 "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(cluster.workdir / "claim-wait-volume"), "type": "DirectoryOrCreate"},
                 "claimRef": {"namespace": namespace, "name": CLAIM}},
    })  # fmt: skip
    try:
        done = wait_phase(kube, namespace, JOB, {"Succeeded", "Failed"}, timeout=TIMEOUT)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert [a["outcome"] for a in done["status"]["attempts"]] == ["Succeeded"]
        assert "capacityWaitSince" not in done["status"]["attempts"][0]  # it never lacked a GPU
    finally:
        try:
            kube.core.delete_persistent_volume(volume)
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise
