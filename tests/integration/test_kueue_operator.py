"""memfit through the real Kueue: the operator process, Kueue v0.19.1, KWOK GPU pools and the pod runner.

A ClusterQueue made by `memfit kueue flavors` holds one T4 GPU, taken by another team's Job. The MOTJ's
profiling Job waits in the queue (Queued, with the Workload's reason), runs once the GPU frees, and the
training Job is admitted onto the flavor of the pool memfit planned, with memfit's nodeSelector intact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kueue_helpers import (
    admitted,
    delete,
    gpu_flavor,
    patch_cluster_queue,
    queued_job,
    set_gpu_quota,
    setup,
    workload_of,
)
from memfit_testbed.cluster_helpers import Kube, condition
from memfit_testbed.operator_helpers import (
    create_job,
    get_job,
    quickstart,
    wait_phase,
)
from operator_ready import kueue_operator

__all__ = ["kueue_operator"]  # the module operator fixture (registered as `operator`), imported
pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 420.0
T4 = {"memfit.dev/pool": "t4-spot"}


def _queued(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    job = get_job(kube, ns, name)
    cond = condition(job, "Queued") if job else None
    return cond if cond and cond["status"] == "True" and cond["reason"] == "Pending" else None


def test_quota_exhausted_waits_queued_then_trains_on_the_flavor_of_its_pool(
    kube: Kube, namespace: str, operator: Path
) -> None:
    docs = setup(namespace, {"t4-spot": 1})
    try:
        kube.batch.create_namespaced_job(namespace, queued_job("other-team", "gpu", T4))
        kube.wait("the other team's Job admitted", lambda: admitted(kube, namespace, "other-team"), timeout=60)

        spec = quickstart("qs", scheduling={"kueueQueue": "gpu"},
                          placement={"nodePools": ["t4-spot"], "maxNodes": 1,
                                     "baseline": {"nodePool": "a100-80-ondemand", "nodes": 1}})
        create_job(kube, namespace, spec)
        # Queued first reads "waits for Kueue's scheduler" (the Workload not yet tried), then Kueue's reason.
        quota = "insufficient unused quota for nvidia.com/gpu in flavor t4-spot"
        cond = kube.wait("MOTJ Queued (Pending) with Kueue's quota reason",
                         lambda: (c := _queued(kube, namespace, "qs")) and quota in c["message"] and c, timeout=90)
        assert cond["message"].startswith("profiling Job qs-profile waits in LocalQueue gpu (Pending: ")
        assert get_job(kube, namespace, "qs")["status"]["phase"] == "Profiling"
        profile_job = kube.batch.read_namespaced_job("qs-profile", namespace)
        assert profile_job.spec.suspend is True
        assert profile_job.metadata.labels["kueue.x-k8s.io/queue-name"] == "gpu"
        assert not kube.pods(namespace, "job-name=qs-profile")

        kube.batch.delete_namespaced_job("other-team", namespace, propagation_policy="Background")
        job = wait_phase(kube, namespace, "qs", ("Succeeded", "Failed"), TIMEOUT, operator)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        queued = condition(job, "Queued")
        assert queued and (queued["status"], queued["reason"]) == ("False", "Admitted")
        assert job["status"]["plan"]["nodePool"] == "t4-spot"

        # Both children went through Kueue, each admitted on the flavor of the pool memfit chose, and the
        # pods kept memfit's selector (Kueue injected the same labels).
        for child in ("qs-profile", "qs-train-0"):
            wl = workload_of(kube, namespace, child)
            assert wl is not None, f"no Workload for {child}"
            assert gpu_flavor(wl) == "t4-spot"
            pods = kube.pods(namespace, f"job-name={child}")
            assert pods and all(p["spec"]["nodeSelector"] == T4 for p in pods)
            assert all(p["spec"]["nodeName"].startswith("t4-spot-") for p in pods)
    finally:
        delete(docs[-2:])


def test_a_queue_that_does_not_exist_is_named_and_nothing_runs(kube: Kube, namespace: str, operator: Path) -> None:
    create_job(kube, namespace, quickstart("lost", scheduling={"kueueQueue": "no-such-queue"}))

    def inadmissible() -> dict[str, Any] | None:
        job = get_job(kube, namespace, "lost")
        cond = condition(job, "Queued") if job else None
        return cond if cond and cond["reason"] == "Inadmissible" else None

    cond = kube.wait("MOTJ Queued (Inadmissible)", inadmissible, timeout=90)
    assert cond["status"] == "True"
    assert cond["message"] == ("profiling Job lost-profile waits in LocalQueue no-such-queue "
                               "(Inadmissible: LocalQueue no-such-queue doesn't exist)"), cond
    assert kube.batch.read_namespaced_job("lost-profile", namespace).spec.suspend is True
    assert not kube.pods(namespace, "memfit.dev/job=lost")


def test_plans_onto_the_pool_whose_quota_is_free(kube: Kube, namespace: str, operator: Path) -> None:
    """The cheapest pool (t4-spot) has a free node but its queue quota is taken; memfit reads the
    ClusterQueue and plans onto l4-ondemand, where Kueue admits it on flavor l4-ondemand. (With the quota
    free the same job plans onto t4-spot: tests/unit/lifecycle/test_queueing.py.)"""
    docs = setup(namespace, {"t4-spot": 1, "l4-ondemand": 4})
    try:
        kube.batch.create_namespaced_job(namespace, queued_job("other-team", "gpu", T4))
        kube.wait("the other team's Job admitted", lambda: admitted(kube, namespace, "other-team"), timeout=60)
        spec = quickstart("qa", scheduling={"kueueQueue": "gpu"},
                          profiling={"nodePool": "l4-ondemand", "timeoutSeconds": 300},
                          placement={"nodePools": ["t4-spot", "l4-ondemand"], "maxNodes": 1,
                                     "baseline": {"nodePool": "a100-80-ondemand", "nodes": 1}})
        create_job(kube, namespace, spec)
        job = wait_phase(kube, namespace, "qa", ("Succeeded", "Failed"), TIMEOUT, operator)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert job["status"]["plan"]["nodePool"] == "l4-ondemand"
        wl = workload_of(kube, namespace, "qa-train-0")
        assert wl is not None and gpu_flavor(wl) == "l4-ondemand"
        pods = kube.pods(namespace, "job-name=qa-train-0")
        assert pods and all(p["spec"]["nodeSelector"] == {"memfit.dev/pool": "l4-ondemand"} for p in pods)
    finally:
        delete(docs[-2:])


def test_a_job_whose_pool_loses_its_quota_moves_to_a_pool_with_quota(
    kube: Kube, namespace: str, operator: Path
) -> None:
    """memfit plans onto t4-spot while the ClusterQueue has a T4 of quota (held: Kueue admits nothing
    yet); then the queue's T4 quota goes to 0 and L4 quota appears. Kueue cannot admit the Job on t4-spot
    (no quota) nor on l4-ondemand (memfit's nodeSelector says t4-spot); after capacityTimeoutSeconds memfit
    ends the attempt (NoQuota) and re-plans onto l4-ondemand, where Kueue admits it and it trains."""
    from memfit.controller.kubeapi import KubeApi
    from memfit_testbed.profiles import seed_profile

    docs = setup(namespace, {"t4-spot": 1, "l4-ondemand": 0})
    cq = f"cq-{namespace}"
    try:
        patch_cluster_queue(kube, cq, {"spec": {"stopPolicy": "Hold"}})
        spec = quickstart("moved", scheduling={"kueueQueue": "gpu"}, recovery={"capacityTimeoutSeconds": 20},
                          placement={"nodePools": ["t4-spot", "l4-ondemand"], "maxNodes": 1,
                                     "baseline": {"nodePool": "a100-80-ondemand", "nodes": 1}})  # fmt: skip
        seed_profile(KubeApi.from_client(kube.api_client), namespace, spec)
        create_job(kube, namespace, spec)
        kube.wait("the training Job on t4-spot", lambda: kube.batch.list_namespaced_job(
            namespace, label_selector="memfit.dev/job=moved,memfit.dev/component=trainer").items or None, timeout=90)
        # The status is patched after the Job is created: wait for it, not for the Job alone.
        plan = kube.wait("the plan in the job's status", lambda: (get_job(kube, namespace, "moved").get("status")
                                                                   or {}).get("plan"), timeout=60)
        assert plan["nodePool"] == "t4-spot", plan
        set_gpu_quota(kube, cq, {"t4-spot": 0, "l4-ondemand": 4}, stopPolicy="None")

        job = wait_phase(kube, namespace, "moved", ("Succeeded", "Failed"), TIMEOUT, operator)
        status = job["status"]
        assert status["phase"] == "Succeeded", status
        assert [(a["nodePool"], a["outcome"]) for a in status["attempts"]] == [
            ("t4-spot", "NoCapacity"), ("l4-ondemand", "Succeeded")], status["attempts"]
        assert "LocalQueue gpu has not admitted training Job moved-train-0 on t4-spot" in status["attempts"][0]["reason"]
        assert "l4-ondemand has quota for" in status["attempts"][0]["reason"]
        wl = workload_of(kube, namespace, "moved-train-1")
        assert wl is not None and gpu_flavor(wl) == "l4-ondemand"
        pods = kube.pods(namespace, "job-name=moved-train-1")
        assert pods and all(p["spec"]["nodeSelector"] == {"memfit.dev/pool": "l4-ondemand"} for p in pods)
    finally:
        delete(docs[-2:])
