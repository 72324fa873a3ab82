"""decide_workload(WorkloadSnapshot) -> CheckDecision: memfit's answer to one Workload waiting on its
`memfit.dev/memory-fit` AdmissionCheck, as a pure function (the MOTJ lifecycle's shape: the reader reads
a snapshot, this decides, the controller applies the effects with the same `apply_writes`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit.api.pool import GPUNodePool
from memfit.catalog import GpuCatalog
from memfit.kube.names import LABEL_MANAGED_BY, MANAGED_BY
from memfit.lifecycle.admission.memory_fit import (
    ANNOTATION_PROBLEM,
    PROBLEM_KEY,
    READY,
    REJECTED,
    RETRY,
    GpuRequest,
    Verdict,
    check_memory_fit,
    gpu_request,
    parse_problem,
    pool_of_flavor,
)
from memfit.lifecycle.result import EventType, PostEvent, SetAdmissionCheck

Manifest = dict[str, Any]
MAX_CHECK_MESSAGE = 8000


@dataclass(frozen=True, slots=True)
class WorkloadSnapshot:
    """What the reader read for one Workload with memfit's check Pending and quota reserved."""

    workload: Manifest
    pending_checks: tuple[str, ...]  # memfit's AdmissionChecks on it that are Pending
    owner: Manifest | None  # its ownerReference to a batch Job, if any
    job: Manifest | None  # that Job (None: not seen yet, or no owner)
    problem: Mapping[str, str] | None  # the data of the ConfigMap the Job's annotation names (None: absent)
    flavor_labels: Mapping[str, str]  # nodeLabels of the GPU flavor Kueue assigned
    pools: Sequence[GPUNodePool]
    queue_pools: Sequence[GPUNodePool]  # the pools of the Workload's ClusterQueue's flavors
    catalog: GpuCatalog
    now: str = ""  # RFC 3339, for lastTransitionTime


@dataclass(frozen=True, slots=True)
class CheckDecision:
    """The verdict and the writes that deliver it, in order."""

    verdict: Verdict
    effects: tuple[SetAdmissionCheck | PostEvent, ...] = field(default_factory=tuple)


def problem_config_map(job: Manifest | None) -> str:
    """The ConfigMap the Job's `memfit.dev/problem` annotation names ("" = none: nothing to read)."""
    meta = (job or {}).get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY:
        return ""
    return str((meta.get("annotations") or {}).get(ANNOTATION_PROBLEM, "")).strip()


def verdict_of(snap: WorkloadSnapshot) -> Verdict | None:
    """The answer; None to look again on the next pass (the owner Job not seen yet)."""
    namespace = snap.workload["metadata"]["namespace"]
    if snap.owner is None:
        return Verdict(READY, "not a batch Job: memory fit not checked (memfit checks Jobs only)")
    if snap.job is None:
        return None
    name = snap.owner["name"]
    if ((snap.job.get("metadata") or {}).get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY:
        return Verdict(READY, "launched by memfit: its plan already fits the pool")
    ref = problem_config_map(snap.job)
    if not ref:
        return Verdict(READY, f"no {ANNOTATION_PROBLEM} annotation on Job {name}: memory fit not checked")
    source = f"ConfigMap {ref} (annotation {ANNOTATION_PROBLEM} of Job {name})"
    if snap.problem is None:
        return Verdict(RETRY, f"{source} not found in namespace {namespace}")
    text = snap.problem.get(PROBLEM_KEY)
    if text is None:
        return Verdict(REJECTED, f"{source} has no key {PROBLEM_KEY} (a MemoryOptimizedTrainingJob manifest)")
    job_spec = parse_problem(text, f"{ref}/{PROBLEM_KEY}")
    if isinstance(job_spec, str):
        return Verdict(REJECTED, job_spec)
    request = gpu_request(snap.workload)
    if request is None:
        return Verdict(READY, "requests no GPU: memory fit not checked")
    pool = pool_of_flavor(request.flavor, snap.flavor_labels, snap.pools)
    return check_memory_fit(job_spec, request, pool=pool, queue_pools=snap.queue_pools, catalog=snap.catalog)


def decide_workload(snap: WorkloadSnapshot) -> CheckDecision | None:
    """Set each pending check's state and message; a Warning Event on the Job when it is not Ready
    (Kueue resets a Rejected or Retry check on eviction: `kubectl describe job` keeps memfit's answer)."""
    verdict = verdict_of(snap)
    if verdict is None:
        return None
    meta = snap.workload["metadata"]
    effects: list[SetAdmissionCheck | PostEvent] = [
        SetAdmissionCheck(namespace=meta["namespace"], workload=meta["name"], check=name, state=verdict.state,
                          message=verdict.message[:MAX_CHECK_MESSAGE], now=snap.now)
        for name in snap.pending_checks
    ]
    if verdict.state != READY and snap.owner is not None:
        involved = {"apiVersion": "batch/v1", "kind": "Job", "name": snap.owner["name"],
                    "namespace": meta["namespace"], "uid": snap.owner.get("uid", "")}
        effects.append(PostEvent(involved=involved, type=EventType.WARNING, reason=f"MemoryFit{verdict.state}",
                                 message=verdict.message))
    return CheckDecision(verdict, tuple(effects))


__all__ = ["CheckDecision", "GpuRequest", "WorkloadSnapshot", "decide_workload", "problem_config_map", "verdict_of"]
