"""Injected faults (issue 8 §4), each driven against a running `memfit operator` and the chaos stages.

Every scenario creates its own MOTJ, injects one fault, waits for the job to settle, and checks the
documented end state (docs/reliability.md): retry, re-plan, resume, or Failed with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from memfit_testbed import kwok_pools
from memfit_testbed.profiles import seed_profile
from memfit_testbed.reliability.chaos import (
    GROUP,
    VERSION,
    ChaosCluster,
    apply_gpunodepools,
    quickstart,
)
from memfit_testbed.reliability.chaos_stages import CRASH_PROFILER, LONG_RUN, SLOW_PROFILER
from memfit_testbed.reliability.fault_kit import (
    FaultResult,
    _create,
    _custom,
    _job_exists,
    _own_problem,
    _result,
    _wait_running,
    condition,
    finish_pods,
    get,
    outcomes,
    pods_of,
    remove_nodes,
    running_pods,
    wait_for,
    wait_phase,
)
from memfit_testbed.reliability.invariants import TERMINAL, check_world

__all__ = ["KWOK_FAULTS", "FaultResult", "consistent", "finish_pods"]

FAST_RECOVERY = {"maxReplans": 2, "capacityTimeoutSeconds": 10}
OOM_AT_3 = {"memfit.dev/inject-oom-at-step": "3"}
FAULT_POOL = "fault-t4"  # a private, cheapest pool whose nodes the nodes-removed scenario deletes


def profiler_crash(cc: ChaosCluster, namespace: str) -> FaultResult:
    """The profiling pod exits 1 every time: one retry (backoffLimit 1), then Failed ProfilingFailed."""
    t0 = time.monotonic()
    name = _create(cc.kube, namespace, _own_problem(quickstart(f"{CRASH_PROFILER}-1"), 3001))
    job = wait_phase(cc.kube, namespace, name, TERMINAL, 120)
    failed = condition(job, "Failed")
    pods = pods_of(cc.kube, namespace, name, "profiler")
    checks = {
        "Failed": job["status"]["phase"] == "Failed",
        "reason ProfilingFailed": failed.get("reason") == "ProfilingFailed",
        "message carries the crash": "profiler crashed" in failed.get("message", ""),
        "one retry (2 profiler pods)": len(pods) == 2,
        "no training Job": not [
            j
            for j in cc.kube.batch.list_namespaced_job(namespace).items
            if j.metadata.name.startswith(f"{name}-train")
        ],
    }
    return _result(
        "profiling pod crash",
        "profiler exits 1 on every try",
        "retried once, then Failed ProfilingFailed with the pod's message",
        job,
        checks,
        t0,
    )


def profiler_timeout(cc: ChaosCluster, namespace: str) -> FaultResult:
    """The profiler never finishes: the Job's deadline (profiling.timeoutSeconds) ends it."""
    t0 = time.monotonic()
    doc = _own_problem(quickstart(f"{SLOW_PROFILER}-1", profiling={"timeoutSeconds": 30}), 3002)
    name = _create(cc.kube, namespace, doc)
    job = wait_phase(cc.kube, namespace, name, TERMINAL, 150)
    failed = condition(job, "Failed")
    checks = {
        "Failed": job["status"]["phase"] == "Failed",
        "reason ProfilingFailed": failed.get("reason") == "ProfilingFailed",
        "message names the deadline": "deadline" in failed.get("message", "").lower(),
        "took at least the timeout": time.monotonic() - t0 >= 30,
    }
    return _result(
        "profiling pod timeout",
        "profiler never finishes, timeoutSeconds 30",
        "Failed ProfilingFailed (DeadlineExceeded) after the timeout",
        job,
        checks,
        t0,
    )


def oom_at_step(cc: ChaosCluster, namespace: str) -> FaultResult:
    """CUDA OOM at step 3 of the first attempt: re-plan with the measured peak, then Succeeded."""
    t0 = time.monotonic()
    placement = {"maxNodes": 1, "nodePools": ["l4-ondemand", "a100-80-ondemand"]}
    doc = _own_problem(quickstart("oom-step", annotations=OOM_AT_3, placement=placement), 3003)
    seed_profile(cc.api, namespace, doc)
    name = _create(cc.kube, namespace, doc)
    job = wait_phase(cc.kube, namespace, name, TERMINAL, 120)
    attempts = job["status"]["attempts"]
    checks = {
        "Succeeded": job["status"]["phase"] == "Succeeded",
        "outcomes OutOfMemory, Succeeded": outcomes(job) == ["OutOfMemory", "Succeeded"],
        "reason names the step": "step 3" in attempts[0].get("reason", ""),
        "re-plan avoids the pool or predicts less": len(attempts) == 2
        and (
            attempts[1]["nodePool"] != attempts[0]["nodePool"]
            or attempts[1]["predictedPeakBytes"] < attempts[0]["predictedPeakBytes"]
        ),
        "OOM attempt's Job deleted": not _job_exists(cc.kube, namespace, f"{name}-train-0"),
    }
    return _result(
        "OOM at step k",
        "CUDA OOM at step 3 (exit 87 + termination message)",
        "re-plan, then Succeeded",
        job,
        checks,
        t0,
    )


def pool_nodes_removed(cc: ChaosCluster, namespace: str) -> FaultResult:
    """The nodes of the pool a running job uses disappear: NoCapacity, re-plan on another pool."""
    t0 = time.monotonic()
    pools = kwok_pools.load_pools()
    private = dataclasses.replace(pools["t4-spot"], name=FAULT_POOL, nodes=1)
    kwok_pools.scale_pool(cc.kube.core, private, 1)
    gpunodepool = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUNodePool",
        "metadata": {"name": FAULT_POOL},
        "spec": {
            "gpu": {"product": "Tesla-T4", "memoryMiB": 15360, "perNode": 1},
            "nodeSelector": {"memfit.dev/pool": FAULT_POOL},
            "pricePerNodeHour": 0.10,  # the cheapest, so the first plan lands here
            "capacityType": "spot",
            "maxNodes": 1,
        },
    }
    apply_gpunodepools(cc.kube, [gpunodepool])
    try:
        doc = quickstart(
            f"{LONG_RUN}nodes",
            recovery=FAST_RECOVERY,
            placement={"maxNodes": 1, "nodePools": [FAULT_POOL, "l4-ondemand"]},
        )
        seed_profile(cc.api, namespace, doc)
        name = _create(cc.kube, namespace, doc)
        running = _wait_running(cc.kube, namespace, name)
        first_pool = running["status"]["attempts"][0]["nodePool"]
        remove_nodes(cc.kube, FAULT_POOL)
        wait_for(
            "attempt 1 running",
            lambda: (
                len(outcomes(get(cc.kube, namespace, name))) == 2 and running_pods(cc.kube, namespace, name)
            ),
            120,
        )
        finish_pods(cc.kube, namespace, name)
        job = wait_phase(cc.kube, namespace, name, TERMINAL, 60)
    finally:
        kwok_pools.delete_pool(cc.kube.core, FAULT_POOL)
        try:
            _custom(cc.kube).delete_cluster_custom_object(GROUP, VERSION, "gpunodepools", FAULT_POOL)
        except ApiException as error:
            if error.status != 404:
                raise
    attempts = job["status"]["attempts"]
    checks = {
        "first attempt on the private pool": first_pool == FAULT_POOL,
        "Succeeded": job["status"]["phase"] == "Succeeded",
        "outcomes NoCapacity, Succeeded": outcomes(job) == ["NoCapacity", "Succeeded"],
        "re-planned elsewhere": len(attempts) == 2 and attempts[1]["nodePool"] != FAULT_POOL,
    }
    return _result(
        "pool's nodes removed mid-run",
        f"all nodes of {FAULT_POOL} deleted while the job runs there",
        "NoCapacity after capacityTimeoutSeconds, re-plan on another pool, Succeeded",
        job,
        checks,
        t0,
    )


def plan_configmap_deleted(cc: ChaosCluster, namespace: str, resync_seconds: float) -> FaultResult:
    """The plan ConfigMap of a running attempt is deleted: rebuilt from the Job's copy, job goes on."""
    t0 = time.monotonic()
    doc = quickstart(
        f"{LONG_RUN}plancm", recovery=FAST_RECOVERY, placement={"maxNodes": 1, "nodePools": ["l4-ondemand"]}
    )
    seed_profile(cc.api, namespace, doc)
    name = _create(cc.kube, namespace, doc)
    _wait_running(cc.kube, namespace, name)
    cm = f"{name}-plan-0"
    before = cc.kube.core.read_namespaced_config_map(cm, namespace).data["plan.json"]
    cc.kube.core.delete_namespaced_config_map(cm, namespace)
    deleted_at = time.monotonic()
    rebuilt = wait_for(
        f"{cm} rebuilt",
        lambda: cc.kube.raw(cc.kube.core.read_namespaced_config_map, cm, namespace),
        30 + 2 * resync_seconds,
    )
    rebuilt_after = time.monotonic() - deleted_at
    finish_pods(cc.kube, namespace, name)
    job = wait_phase(cc.kube, namespace, name, TERMINAL, 60)
    checks = {
        "ConfigMap rebuilt": bool(rebuilt),
        "same plan": json.loads(rebuilt["data"]["plan.json"]) == json.loads(before),
        "Succeeded in the same attempt": job["status"]["phase"] == "Succeeded"
        and outcomes(job) == ["Succeeded"],
    }
    result = _result(
        "plan ConfigMap deleted",
        "delete <job>-plan-0 while the job runs",
        "rebuilt from the training Job's copy (memfit.dev/plan-json), same attempt Succeeded",
        job,
        checks,
        t0,
    )
    result.details.append(f"rebuilt {rebuilt_after:.1f}s after the delete")
    return result


def trainer_preempted(cc: ChaosCluster, namespace: str) -> FaultResult:
    """The running trainer pod is evicted (pre-emption): the Job ignores the disruption and replaces it."""
    t0 = time.monotonic()
    doc = quickstart(
        f"{LONG_RUN}evict", recovery=FAST_RECOVERY, placement={"maxNodes": 1, "nodePools": ["l4-ondemand"]}
    )
    seed_profile(cc.api, namespace, doc)
    name = _create(cc.kube, namespace, doc)
    _wait_running(cc.kube, namespace, name)
    pod = pods_of(cc.kube, namespace, name, "trainer")[0]["metadata"]["name"]
    cc.kube.core.create_namespaced_pod_eviction(
        pod, namespace, {"metadata": {"name": pod, "namespace": namespace}}
    )
    replacement = wait_for(
        "replacement pod running", lambda: [p for p in running_pods(cc.kube, namespace, name) if p != pod], 90
    )
    finish_pods(cc.kube, namespace, name)
    job = wait_phase(cc.kube, namespace, name, TERMINAL, 60)
    train = cc.kube.raw(cc.kube.batch.read_namespaced_job, f"{name}-train-0", namespace) or {}
    status = train.get("status") or {}
    checks = {
        "Succeeded in the same attempt": job["status"]["phase"] == "Succeeded"
        and outcomes(job) == ["Succeeded"],
        "disruption not counted as a failure": not status.get("failed"),
        "the evicted pod was replaced": bool(replacement) and int(status.get("succeeded") or 0) >= 1,
    }
    return _result(
        "trainer pod pre-empted",
        "Eviction API on the running trainer pod (DisruptionTarget)",
        "podFailurePolicy Ignore: replacement pod resumes, same attempt Succeeded",
        job,
        checks,
        t0,
    )


def pods_refused(cc: ChaosCluster, namespace: str) -> FaultResult:
    """The training pods are refused at admission (no such PriorityClass): Failed PodsNotCreated."""
    t0 = time.monotonic()
    doc = quickstart(
        "refused-pods", recovery=FAST_RECOVERY, scheduling={"priorityClassName": "no-such-class"}
    )
    seed_profile(cc.api, namespace, doc)
    name = _create(cc.kube, namespace, doc)
    job = wait_phase(cc.kube, namespace, name, TERMINAL, 120)
    failed = condition(job, "Failed")
    checks = {
        "Failed": job["status"]["phase"] == "Failed",
        "reason PodsNotCreated": failed.get("reason") == "PodsNotCreated",
        "message names the Job": f"{name}-train-0" in failed.get("message", ""),
    }
    return _result(
        "training pods refused",
        "priorityClassName of a PriorityClass that does not exist",
        "Failed PodsNotCreated after capacityTimeoutSeconds (not Launching forever)",
        job,
        checks,
        t0,
    )


def profiler_unschedulable(cc: ChaosCluster, namespace: str) -> FaultResult:
    """The profiling pool never has a free GPU: placed again after capacityTimeoutSeconds, and Failed
    ProfilingFailed once profiling.timeoutSeconds has passed in all."""
    t0 = time.monotonic()
    empty = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUNodePool",
        "metadata": {"name": "no-gpus"},
        "spec": {
            "gpu": {"product": "Tesla-T4", "memoryMiB": 15360, "perNode": 1},
            "nodeSelector": {"memfit.dev/pool": "no-gpus"},  # matches no node
            "pricePerNodeHour": 0.1,
            "maxNodes": 1,
        },
    }
    apply_gpunodepools(cc.kube, [empty])
    try:
        profiling = {"nodePool": "no-gpus", "timeoutSeconds": 30, "reuse": False}
        doc = _own_problem(quickstart("unplaceable", profiling=profiling, recovery=FAST_RECOVERY), 3004)
        name = _create(cc.kube, namespace, doc)
        job = wait_phase(cc.kube, namespace, name, TERMINAL, 150)
    finally:
        _custom(cc.kube).delete_cluster_custom_object(GROUP, VERSION, "gpunodepools", "no-gpus")
    failed = condition(job, "Failed")
    events = cc.kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    checks = {
        "Failed ProfilingFailed": job["status"]["phase"] == "Failed"
        and failed.get("reason") == "ProfilingFailed",
        "message says no GPU": "no GPU" in failed.get("message", ""),
        "placed again at least once": "ProfilingRescheduled" in {e.reason for e in events},
        "within the timeout and a capacity timeout": time.monotonic() - t0 < 30 + 10 + 30,
    }
    return _result(
        "profiling pod unschedulable",
        "profiling.nodePool with no node, timeoutSeconds 30, capacityTimeoutSeconds 10",
        "placed again after 10 s, Failed ProfilingFailed after 30 s in all (not rescheduled forever)",
        job,
        checks,
        t0,
    )


KWOK_FAULTS: dict[str, Callable[..., FaultResult]] = {
    "profiler-crash": profiler_crash,
    "profiler-timeout": profiler_timeout,
    "profiler-unschedulable": profiler_unschedulable,
    "oom-at-step": oom_at_step,
    "pool-nodes-removed": pool_nodes_removed,
    "plan-configmap-deleted": plan_configmap_deleted,
    "trainer-preempted": trainer_preempted,
    "pods-refused": pods_refused,
}


def consistent(cc: ChaosCluster, namespace: str) -> list[str]:
    """Invariant violations left by the fault scenarios (duplicates are checked per scenario)."""
    report = check_world(cc.kube, namespace)
    return report.stuck + report.orphans + report.inconsistent
