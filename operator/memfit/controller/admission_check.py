"""The `memfit.dev/memory-fit` AdmissionCheck controller: Kueue asks, memfit answers for Jobs it did
not launch (lifecycle.memory_fit decides; this module reads and writes).

Every `interval` seconds, when some AdmissionCheck names the controller:
1. each such AdmissionCheck gets `Active=True` (Kueue keeps a ClusterQueue that lists an inactive
   check inactive);
2. each Workload with one of those checks `Pending` and quota reserved (a flavor assigned) gets the
   check's state and message, by server-side apply of its own entry of `status.admissionChecks`.
Kueue then admits (all checks Ready), evicts and requeues (Retry) or deactivates (Rejected) it.
A poll, not a watch: a check is answered within `interval`, and the operator needs no Kueue watch
(kopf would fail without Kueue's CRDs or the read). Nothing is done without Kueue or the RBAC.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from memfit import metrics
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.controller.events import event_manifest
from memfit.controller.kubeapi import KubeApi
from memfit.kube.names import LABEL_MANAGED_BY, MANAGED_BY
from memfit.lifecycle.memory_fit import (
    ANNOTATION_PROBLEM,
    CONTROLLER_NAME,
    PENDING,
    PROBLEM_KEY,
    READY,
    REJECTED,
    RETRY,
    Verdict,
    check_memory_fit,
    gpu_request,
    parse_problem,
    pool_of_flavor,
)

log = logging.getLogger("memfit.admission")
Manifest = dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _active(check: Manifest) -> bool:
    conditions = (check.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def _pools(api: KubeApi) -> list[GPUNodePool]:
    pools: list[GPUNodePool] = []
    for raw in api.list_pools():
        try:
            pools.append(GPUNodePool.model_validate(raw | {"status": None}))
        except ValidationError:
            continue  # the pool handler reports invalid pools
    return pools


def _owner_job(workload: Manifest) -> Manifest | None:
    """The Workload's ownerReference to its batch Job, if it has one."""
    return next((r for r in workload["metadata"].get("ownerReferences") or [] if r.get("kind") == "Job"), None)


class MemoryFitController:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def run_forever(self, stop: threading.Event, interval_seconds: float) -> None:
        while not stop.wait(interval_seconds):
            try:
                self.pass_once()
            except Exception as error:  # never crash the operator; the next pass retries
                metrics.RECONCILE_ERRORS.labels("AdmissionCheck").inc()
                log.warning("memory-fit admission check pass failed: %s", error)

    def pass_once(self) -> int:
        """Activate memfit's AdmissionChecks and answer their pending Workloads; how many answered."""
        names = set()
        for check in self.api.list_admission_checks():
            if (check.get("spec") or {}).get("controllerName") != CONTROLLER_NAME:
                continue
            name = check["metadata"]["name"]
            names.add(name)
            if not _active(check):
                self.api.apply_admission_check_status(name, [{
                    "type": "Active", "status": "True", "reason": "Active", "lastTransitionTime": _now(),
                    "message": "memfit's memory-fit controller answers this check",
                    "observedGeneration": check["metadata"].get("generation", 0)}])
                log.info("AdmissionCheck %s is active", name)
        if not names:
            return 0
        answered = 0
        pools: list[GPUNodePool] | None = None
        for workload in self.api.list_all_workloads():
            pending = [c["name"] for c in (workload.get("status") or {}).get("admissionChecks") or []
                       if c.get("name") in names and c.get("state") == PENDING]
            if not pending or not (workload.get("status") or {}).get("admission"):
                continue
            if pools is None:
                pools = _pools(self.api)
            owner = _owner_job(workload)
            verdict = self.verdict(workload, pools, owner)
            if verdict is None:
                continue
            meta = workload["metadata"]
            for name in pending:
                self.api.apply_workload_check(meta["namespace"], meta["name"], {
                    "name": name, "state": verdict.state, "message": verdict.message[:8000],
                    "lastTransitionTime": _now()})
            metrics.ADMISSION_CHECKS.labels(verdict.state).inc()
            log.info("memory-fit %s/%s: %s: %s", meta["namespace"], meta["name"], verdict.state, verdict.message)
            if verdict.state != READY and owner is not None:
                self._job_event(meta["namespace"], owner, verdict)
            answered += 1
        return answered

    def _job_event(self, namespace: str, owner: Manifest, verdict: Verdict) -> None:
        """A Warning Event on the Job (Kueue resets a Rejected or Retry check on eviction; `kubectl describe
        job` keeps memfit's answer). Best effort; posted from this controller's own thread."""
        involved = {"apiVersion": "batch/v1", "kind": "Job", "name": owner["name"], "namespace": namespace,
                    "uid": owner.get("uid", "")}
        try:
            self.api.create_event(event_manifest(involved, reason=f"MemoryFit{verdict.state}",
                                                 message=verdict.message, type_="Warning", now=datetime.now(UTC)))
        except Exception as error:  # an Event never fails the check
            log.warning("could not post the memory-fit event for Job %s/%s: %s", namespace, owner["name"], error)

    def verdict(self, workload: Manifest, pools: list[GPUNodePool], owner: Manifest | None) -> Verdict | None:
        """The answer for one Workload whose owner Job is `owner` (its ownerReference); None to look again
        on the next pass (the Job not seen yet)."""
        namespace = workload["metadata"]["namespace"]
        if owner is None:
            return Verdict(READY, "not a batch Job: memory fit not checked (memfit checks Jobs only)")
        job = self.api.get_job(namespace, owner["name"])
        if job is None:
            return None
        meta = job.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY:
            return Verdict(READY, "launched by memfit: its plan already fits the pool")
        ref = (meta.get("annotations") or {}).get(ANNOTATION_PROBLEM, "").strip()
        if not ref:
            return Verdict(READY, f"no {ANNOTATION_PROBLEM} annotation on Job {owner['name']}: memory fit not checked")
        config_map = self.api.get_config_map(namespace, ref)
        source = f"ConfigMap {ref} (annotation {ANNOTATION_PROBLEM} of Job {owner['name']})"
        if config_map is None:
            return Verdict(RETRY, f"{source} not found in namespace {namespace}")
        text = (config_map.get("data") or {}).get(PROBLEM_KEY)
        if text is None:
            return Verdict(REJECTED, f"{source} has no key {PROBLEM_KEY} (a MemoryOptimizedTrainingJob manifest)")
        job_spec = parse_problem(text, f"{ref}/{PROBLEM_KEY}")
        if isinstance(job_spec, str):
            return Verdict(REJECTED, job_spec)
        request = gpu_request(workload)
        if request is None:
            return Verdict(READY, "requests no GPU: memory fit not checked")
        flavor = self.api.get_resource_flavor(request.flavor) or {}
        labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
        pool = pool_of_flavor(request.flavor, labels, pools)
        return check_memory_fit(job_spec, request, pool=pool, queue_pools=self._queue_pools(workload, pools),
                                catalog=CATALOG)

    def _queue_pools(self, workload: Manifest, pools: list[GPUNodePool]) -> list[GPUNodePool]:
        """The pools of the flavors of the Workload's ClusterQueue (for where it would fit)."""
        queue = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
        cq = self.api.get_cluster_queue(str(queue)) if queue else None
        names = {str(f.get("name")) for g in ((cq or {}).get("spec") or {}).get("resourceGroups") or []
                 for f in g.get("flavors") or []}
        out = []
        for name in sorted(names):
            flavor = self.api.get_resource_flavor(name) or {}
            pool = pool_of_flavor(name, (flavor.get("spec") or {}).get("nodeLabels") or {}, pools)
            if pool is not None and pool not in out:
                out.append(pool)
        return out
