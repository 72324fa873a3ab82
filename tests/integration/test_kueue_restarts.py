"""Operator and Kueue restarts while memfit's children wait in the queue: no duplicate Job, none stuck.

The real Kueue v0.19.1 manager and `memfit operator` (pod runner), a ClusterQueue with one T4 of quota
that another team holds. Twice -- while the profiling Job waits for that quota, and while the training
Job waits in the held ClusterQueue -- the operator is killed (SIGKILL) and started again and the Kueue
manager is stopped and started again; then the queue admits. Each child exists once, has one Workload, and the job Succeeds.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from kueue_helpers import admitted, delete, patch_cluster_queue, queued_job, setup, workload_of
from memfit_testbed.cluster_helpers import Kube, condition
from memfit_testbed.kueue import KueueManager
from memfit_testbed.operator_helpers import (
    apply_pools,
    create_job,
    get_job,
    quickstart,
    start_operator,
    stop_operator,
    wait_phase,
)
from operator_ready import wait_healthy

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
T4 = {"memfit.dev/pool": "t4-spot"}


def _queued(kube: Kube, ns: str, name: str, child: str) -> dict[str, Any] | None:
    job = get_job(kube, ns, name)
    cond = condition(job, "Queued") if job else None
    ok = cond and cond["status"] == "True" and f"Job {child} waits" in cond["message"]
    return cond if ok else None


def _children(kube: Kube, ns: str, name: str) -> list[str]:
    return sorted(j.metadata.name for j in kube.batch.list_namespaced_job(ns, label_selector=f"memfit.dev/job={name}").items)


def _workloads_of(kube: Kube, ns: str, job: str) -> int:
    from kubernetes import client

    items = client.CustomObjectsApi(kube.api_client).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"]
    return sum(1 for w in items if any(r.get("kind") == "Job" and r.get("name") == job
                                       for r in w["metadata"].get("ownerReferences") or []))


def test_operator_and_kueue_restarts_mid_admission_leave_no_duplicate_or_stuck_job(
    cluster: Any, kube: Kube, kueue: KueueManager, namespace: str, request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    request.getfixturevalue("install_crds")
    apply_pools(kube)
    log = tmp_path / "operator.log"
    proc, port = start_operator(cluster.kubeconfig, log)
    docs = setup(namespace, {"t4-spot": 1})

    def restart_both() -> None:
        nonlocal proc, port
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kueue.stop()
        kueue.start()
        proc, port = start_operator(cluster.kubeconfig, log)
        wait_healthy(port, log)

    try:
        wait_healthy(port, log)
        kube.batch.create_namespaced_job(namespace, queued_job("team-a", "gpu", T4))
        kube.wait("team-a admitted", lambda: admitted(kube, namespace, "team-a"), timeout=60)
        spec = quickstart("rs", scheduling={"kueueQueue": "gpu"},
                          placement={"nodePools": ["t4-spot"], "maxNodes": 1,
                                     "baseline": {"nodePool": "a100-80-ondemand", "nodes": 1}})
        create_job(kube, namespace, spec)
        kube.wait("profiling queued", lambda: _queued(kube, namespace, "rs", "rs-profile"), timeout=90)

        restart_both()
        kube.wait("profiling still queued after the restarts",
                  lambda: _queued(kube, namespace, "rs", "rs-profile"), timeout=90)
        assert _children(kube, namespace, "rs") == ["rs-profile"]
        assert _workloads_of(kube, namespace, "rs-profile") == 1

        # The ClusterQueue is held (stopPolicy Hold: admitted Workloads go on, nothing new is admitted), so
        # once profiling ends memfit plans (the quota is free) and its training Job waits in the queue.
        kube.batch.delete_namespaced_job("team-a", namespace, propagation_policy="Background")
        kube.wait("profiling admitted", lambda: admitted(kube, namespace, "rs-profile"), timeout=60)
        patch_cluster_queue(kube, f"cq-{namespace}", {"spec": {"stopPolicy": "Hold"}})
        kube.wait("training queued", lambda: _queued(kube, namespace, "rs", "rs-train-0"), timeout=240)

        restart_both()
        kube.wait("training still queued after the restarts",
                  lambda: _queued(kube, namespace, "rs", "rs-train-0"), timeout=90)
        assert _children(kube, namespace, "rs") == ["rs-profile", "rs-train-0"]
        patch_cluster_queue(kube, f"cq-{namespace}", {"spec": {"stopPolicy": "None"}})
        job = wait_phase(kube, namespace, "rs", ("Succeeded", "Failed"), 300, log)
        status = job["status"]
        assert status["phase"] == "Succeeded", status
        assert [a.get("outcome") for a in status["attempts"]] == ["Succeeded"], status["attempts"]
        assert _children(kube, namespace, "rs") == ["rs-profile", "rs-train-0"]
        for child in ("rs-profile", "rs-train-0"):
            assert _workloads_of(kube, namespace, child) == 1, child
            assert workload_of(kube, namespace, child) is not None
    finally:
        stop_operator(proc)
        for job in ("team-a",):
            kube.raw(kube.batch.delete_namespaced_job, job, namespace, propagation_policy="Background")
        delete(docs[-2:])
