"""Read the world: a MOTJ's children (profiling Job, training Job, their pods) as plain summaries."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memfit.kube.names import LABEL_ATTEMPT, LABEL_COMPONENT, LABEL_JOB

Manifest = dict[str, Any]

REASON_CUDA_OOM = "CUDAOutOfMemory"
REASON_HOST_OOM = "HostOutOfMemory"
REASON_INVALID_PLAN = "InvalidPlan"
EXIT_OUT_OF_MEMORY = 87
EXIT_INVALID_PLAN = 88


@dataclass(frozen=True, slots=True)
class PodSummary:
    """What memfit needs from one pod."""

    name: str
    phase: str
    exit_code: int | None = None
    container_reason: str = ""  # e.g. OOMKilled, Completed, Error
    message: dict[str, Any] = field(default_factory=dict)  # parsed termination message
    raw_message: str = ""
    unschedulable_since: datetime | None = None
    unschedulable_message: str = ""
    running: bool = False

    @property
    def out_of_memory(self) -> str | None:
        """CUDAOutOfMemory, HostOutOfMemory or None."""
        if self.message.get("reason") == REASON_CUDA_OOM or self.exit_code == EXIT_OUT_OF_MEMORY:
            return REASON_CUDA_OOM
        if self.container_reason == "OOMKilled" or self.message.get("reason") == REASON_HOST_OOM:
            return REASON_HOST_OOM
        return None

    @property
    def peak_bytes(self) -> int | None:
        value = self.message.get("peakBytes")
        return int(value) if isinstance(value, int | float) and value >= 0 else None


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A batch Job and its pods."""

    name: str
    exists: bool
    complete: bool = False
    failed: bool = False
    failure_reason: str = ""
    failure_message: str = ""
    suspended: bool = False
    pods: tuple[PodSummary, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.complete or self.failed


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def summarize_pod(pod: Manifest) -> PodSummary:
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    unschedulable_since: datetime | None = None
    unschedulable_message = ""
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == ("Unschedulable")
        ):
            unschedulable_since = parse_time(cond.get("lastTransitionTime"))
            unschedulable_message = str(cond.get("message") or "")
    exit_code: int | None = None
    reason = ""
    raw = ""
    running = False
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("running"):
            running = True
        terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if terminated:
            exit_code = terminated.get("exitCode")
            reason = str(terminated.get("reason") or "")
            raw = str(terminated.get("message") or "")
    message: dict[str, Any] = {}
    if raw:
        try:
            parsed = json.loads(raw)
            message = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            message = {}
    return PodSummary(
        name=pod["metadata"]["name"],
        phase=phase,
        exit_code=exit_code,
        container_reason=reason,
        message=message,
        raw_message=raw,
        unschedulable_since=unschedulable_since,
        unschedulable_message=unschedulable_message,
        running=running or phase == "Running",
    )


def summarize_job(job: Manifest | None, pods: list[Manifest], name: str) -> JobSummary:
    if job is None:
        return JobSummary(name=name, exists=False)
    status = job.get("status") or {}
    complete = failed = False
    failure_reason = failure_message = ""
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            complete = True
        elif cond.get("type") == "Failed":
            failed = True
            failure_reason = str(cond.get("reason") or "")
            failure_message = str(cond.get("message") or "")
    ordered = sorted((summarize_pod(p) for p in pods), key=lambda p: p.name)
    return JobSummary(
        name=name,
        exists=True,
        complete=complete,
        failed=failed,
        failure_reason=failure_reason,
        failure_message=failure_message,
        suspended=bool((job.get("spec") or {}).get("suspend")),
        pods=tuple(ordered),
        annotations=dict((job.get("metadata") or {}).get("annotations") or {}),
    )


def pod_selector(job: str, component: str, attempt: int | None = None) -> str:
    selector = f"{LABEL_JOB}={job},{LABEL_COMPONENT}={component}"
    if attempt is not None:
        selector += f",{LABEL_ATTEMPT}={attempt}"
    return selector
