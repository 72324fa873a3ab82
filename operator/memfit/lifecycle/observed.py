"""A MOTJ's children (profiling Job, training Job, their pods) as plain, typed summaries.

The controller reads the manifests; these pure functions turn them into what a decision looks at."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memfit.api.termination import (
    KEY_PEAK_BYTES,
    KEY_REASON,
    TerminationReason,
    out_of_memory_reason,
    parse_message,
)
from memfit.kube.kueue import LABEL_QUEUE
from memfit.kube.names import LABEL_ATTEMPT, LABEL_COMPONENT, LABEL_JOB

Manifest = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PodSummary:
    """What memfit needs from one pod."""

    name: str
    phase: str
    exit_code: int | None = None
    container_reason: str = ""  # e.g. OOMKilled, Completed, Error
    message: dict[str, object] = field(default_factory=dict)  # parsed termination message
    raw_message: str = ""
    unschedulable_since: datetime | None = None
    unschedulable_message: str = ""
    claims: tuple[str, ...] = ()  # the PersistentVolumeClaims its volumes name
    running: bool = False
    image: str = ""  # the (first) container's image
    image_problem: str = ""  # why its image cannot run: "<reason>: <kubelet message>", "" when none
    config_problem: str = ""  # CreateContainerConfigError: the kubelet's message (a Secret or key missing)
    created_at: datetime | None = None  # metadata.creationTimestamp
    failed_init_container: str = ""  # the init container whose exit is exit_code, "" for the main container
    init_messages: tuple[tuple[str, str], ...] = ()  # (name, termination message) of init containers that ended

    def init_message(self, container: str) -> str | None:
        """The termination message of init container `container`, None when it has not ended."""
        return next((message for name, message in self.init_messages if name == container), None)

    @property
    def waits_for_claim(self) -> bool:
        """Unschedulable only because a claim it mounts is not bound or not seen yet by the scheduler:
        no node pool would take it sooner, so this is not missing capacity."""
        return self.unschedulable_since is not None and claim_wait(self.unschedulable_message)

    @property
    def image_permanent(self) -> bool:
        """The image can never start on this node as asked (waiting and retrying cannot help)."""
        return self.image_problem.split(":", 1)[0] in PERMANENT_IMAGE_REASONS

    def exit_detail(self) -> str:
        """How the container ended, for a failure message: names the image when the container wrote
        no termination message (it died before memfit-trainer could, e.g. a broken entrypoint)."""
        if self.exit_code is None:
            return ""
        said = f": {self.raw_message[:512]}" if self.raw_message else " before writing a termination message"
        image = f" (image {self.image})" if self.image and not self.raw_message else ""
        which = f"pod {self.name}'s init container {self.failed_init_container}" if self.failed_init_container \
            else f"pod {self.name}"
        return f"{which} exited {self.exit_code} ({self.container_reason or 'Error'}){image}{said}"

    @property
    def out_of_memory(self) -> TerminationReason | None:
        """CUDAOutOfMemory, HostOutOfMemory or None."""
        return out_of_memory_reason(
            self.message, exit_code=self.exit_code, container_reason=self.container_reason, text=self.raw_message
        )

    @property
    def invalid_plan(self) -> bool:
        """The trainer refused the plan (a bug or a plan from another version): re-planning cannot help."""
        return self.message.get(KEY_REASON) == TerminationReason.INVALID_PLAN

    @property
    def over_plan(self) -> bool:
        """The trainer's first-steps check stopped it: the measured peak exceeded prediction + headroom."""
        return self.message.get(KEY_REASON) == TerminationReason.MEMORY_OVER_PLAN

    @property
    def peak_bytes(self) -> int | None:
        value = self.message.get(KEY_PEAK_BYTES)
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
    labels: dict[str, str] = field(default_factory=dict)
    deleting: bool = False  # has a deletionTimestamp: going away
    started_at: datetime | None = None  # status.startTime: the Job controller's first sync
    pods_counted: bool = False  # the Job's status counts a pod (active, failed, succeeded, ...)
    queue: str = ""  # the Job's kueue.x-k8s.io/queue-name label: Kueue admits (unsuspends) it
    queue_reason: str = ""  # its Workload's state (memfit.lifecycle.queueing.workload_state), when read
    queue_message: str = ""

    @property
    def finished(self) -> bool:
        return self.complete or self.failed

    @property
    def never_had_pods(self) -> bool:
        """No pod now and none ever counted: not active, failed, succeeded, ready, terminating or
        uncounted (a pod deleted with its node counts as failed; one replaced after a pre-emption is
        only briefly absent, and its attempt was seen Running)."""
        return not self.pods and not self.pods_counted


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# containerStatuses[].state.waiting.reason values that mean the image cannot be run as asked.
PERMANENT_IMAGE_REASONS = frozenset({"ErrImageNeverPull", "InvalidImageName"})
IMAGE_REASONS = PERMANENT_IMAGE_REASONS | {"ErrImagePull", "ImagePullBackOff"}
# The kubelet cannot build the container's config: a Secret, ConfigMap or key it names is missing.
CONFIG_ERROR = "CreateContainerConfigError"


# kube-scheduler's VolumeBinding PreFilter words for a pod whose claims are not ready yet
# (pkg/scheduler/framework/plugins/volumebinding/volume_binding.go): the provisioner has not bound an
# immediate claim, the scheduler's informer has not seen the claim (after an API server restart), or the
# ephemeral volume controller has not created it. A claim being deleted or lost is not in the list.
_CLAIM_WAITS = re.compile(
    r'pod has unbound immediate PersistentVolumeClaims'
    r'|persistentvolumeclaim "[^"]+" not found'
    r'|waiting for ephemeral volume controller to create the persistentvolumeclaim'
)


def claim_wait(message: str) -> bool:
    """The scheduler's Unschedulable message says the pod waits for a claim (see _CLAIM_WAITS)."""
    return _CLAIM_WAITS.search(message) is not None


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
    containers = (pod.get("spec") or {}).get("containers") or []
    image = str(containers[0].get("image") or "") if containers else ""
    image_problem = ""
    for cs in status.get("initContainerStatuses") or []:
        # An init container (the download step) pulls first: while its image fails, the others wait.
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_REASONS and not image_problem:
            image_problem = f"{waiting['reason']}: {str(waiting.get('message') or '')[:400]}".rstrip(": ")
            image = str(cs.get("image") or image)
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("running"):
            running = True
        image = image or str(cs.get("image") or "")
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in IMAGE_REASONS and not image_problem:
            image_problem = f"{waiting['reason']}: {str(waiting.get('message') or '')[:400]}".rstrip(": ")
        terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if terminated:
            exit_code = terminated.get("exitCode")
            reason = str(terminated.get("reason") or "")
            raw = str(terminated.get("message") or "")
    config_problem = ""
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == CONFIG_ERROR and not config_problem:
            config_problem = str(waiting.get("message") or CONFIG_ERROR)[:400]
    failed_init = ""
    init_messages = []
    for cs in status.get("initContainerStatuses") or []:
        ended = (cs.get("state") or {}).get("terminated")
        if ended:
            init_messages.append((str(cs.get("name") or ""), str(ended.get("message") or "")))
    for cs in status.get("initContainerStatuses") or []:
        # A failed download step (memfit-trainer fetch) or config writer is why the pod failed: its message
        # says which field; the failure names that container and its image, not the main one's.
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if exit_code is None and terminated.get("exitCode") not in (None, 0):
            exit_code = terminated.get("exitCode")
            reason = str(terminated.get("reason") or "")
            raw = str(terminated.get("message") or "")
            failed_init = str(cs.get("name") or "")
            image = str(cs.get("image") or image)
    message = parse_message(raw)
    return PodSummary(
        name=pod["metadata"]["name"],
        phase=phase,
        exit_code=exit_code,
        container_reason=reason,
        message=message,
        raw_message=raw,
        unschedulable_since=unschedulable_since,
        unschedulable_message=unschedulable_message,
        claims=tuple(
            str(v["persistentVolumeClaim"].get("claimName") or "")
            for v in (pod.get("spec") or {}).get("volumes") or []
            if isinstance(v.get("persistentVolumeClaim"), dict)
        ),
        running=running or phase == "Running",
        image=image,
        image_problem=image_problem,
        config_problem=config_problem,
        created_at=parse_time((pod.get("metadata") or {}).get("creationTimestamp")),
        failed_init_container=failed_init,
        init_messages=tuple(init_messages),
    )


def summarize_job(
    job: Manifest | None, pods: list[Manifest], name: str, workload: Manifest | None = None
) -> JobSummary:
    """The Job, its pods and (for a queued Job) its Kueue Workload as one value."""
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
    meta = job.get("metadata") or {}
    keys = ("active", "failed", "succeeded", "ready", "terminating")
    uncounted = any((status.get("uncountedTerminatedPods") or {}).values())
    reason, message = workload_state(workload)
    return JobSummary(
        name=name,
        exists=True,
        complete=complete,
        failed=failed,
        failure_reason=failure_reason,
        failure_message=failure_message,
        suspended=bool((job.get("spec") or {}).get("suspend")),
        pods=tuple(ordered),
        annotations=dict(meta.get("annotations") or {}),
        labels=dict(meta.get("labels") or {}),
        deleting=bool(meta.get("deletionTimestamp")),
        started_at=parse_time(status.get("startTime")),
        pods_counted=uncounted or any(status.get(k) for k in keys),
        queue=str((meta.get("labels") or {}).get(LABEL_QUEUE, "")),
        queue_reason=reason,
        queue_message=message,
    )


WORKLOAD_NOT_FOUND = "WorkloadNotFound"
# Kueue's label on a Workload naming the uid of the Job it stands for (pkg/controller/constants).
LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"


def workload_state(workload: Manifest | None) -> tuple[str, str]:
    """(reason, message) of a Kueue Workload: `Admitted`; else its QuotaReserved=False reason (Kueue's
    CamelCase: `Pending` with "couldn't assign flavors ... insufficient unused quota", `Inadmissible` for a
    LocalQueue that does not exist...); `QuotaReserved` while admission checks run; `WorkloadNotFound`
    before Kueue made one."""
    if workload is None:
        return WORKLOAD_NOT_FOUND, "Kueue has not created a Workload for the Job yet"
    conds = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted, reserved = conds.get("Admitted"), conds.get("QuotaReserved")
    if admitted is not None and admitted.get("status") == "True":
        return "Admitted", str(admitted.get("message") or "")
    if reserved is not None and reserved.get("status") == "True":
        return "QuotaReserved", str(reserved.get("message") or "")
    if reserved is not None:
        return str(reserved.get("reason") or "Pending"), str(reserved.get("message") or "")
    return "Pending", "the Workload waits for Kueue's scheduler"


def pod_selector(job: str, component: str, attempt: int | None = None) -> str:
    selector = f"{LABEL_JOB}={job},{LABEL_COMPONENT}={component}"
    if attempt is not None:
        selector += f",{LABEL_ATTEMPT}={attempt}"
    return selector
