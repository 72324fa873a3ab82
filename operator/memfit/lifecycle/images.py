"""A pod whose image cannot start: a condition naming the image and the cause, never a silent wait.

`ErrImageNeverPull` (pull policy `Never`, image not on the node) and `InvalidImageName` can never
resolve: the job fails at once. `ErrImagePull` / `ImagePullBackOff` may be a registry hiccup: the job
shows the cause in a condition and fails once it lasted `recovery.capacityTimeoutSeconds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.reasons import Reason
from memfit.lifecycle.observed import JobSummary, PodSummary

# The condition reasons a Blocker sets while the kubelet retries.
BLOCKER_REASONS = (Reason.IMAGE_PULL_FAILING, Reason.CONTAINER_CONFIG_ERROR)


@dataclass(frozen=True, slots=True)
class Blocker:
    """A pod of a Job that cannot start: what to show while waiting, and whether waiting is over."""

    waiting: Reason  # the condition reason while the kubelet retries (ImagePullFailing, ContainerConfigError)
    failure: Reason  # the Failed reason once it gives up (ImageUnavailable, ContainerConfigError)
    message: str
    timeout_seconds: int
    gives_up: bool

    def waiting_message(self) -> str:
        return f"{self.message} (gives up after {self.timeout_seconds}s)"

    def failure_message(self) -> str:
        if self.failure == Reason.IMAGE_UNAVAILABLE:
            return self.message
        return f"{self.message} (for {self.timeout_seconds}s, capacityTimeoutSeconds)"


def pod_blocker(
    job: JobSummary, spec: MemoryOptimizedTrainingJobSpec, *, namespace: str, now: datetime, what: str = ""
) -> Blocker | None:
    """The first reason the Job's pods cannot start (its image, then its config: a Secret or key), or
    None. `what` prefixes the message ("profiling "). The wait is counted from the Job's start for an
    image and from the pod's creation for its config (a replacement pod an hour in starts anew)."""
    if job.finished:
        return None
    timeout = spec.recovery.capacity_timeout_seconds
    if (pod := image_blocked(job)) is not None:
        gives_up = image_gives_up(pod, since=job.started_at, now=now, timeout_seconds=timeout)
        return Blocker(Reason.IMAGE_PULL_FAILING, Reason.IMAGE_UNAVAILABLE, f"{what}{image_message(pod)}", timeout,
                       gives_up)
    if (pod := config_blocked(job)) is not None:
        since = pod.created_at or job.started_at
        gives_up = since is not None and (now - since).total_seconds() >= timeout
        return Blocker(Reason.CONTAINER_CONFIG_ERROR, Reason.CONTAINER_CONFIG_ERROR,
                       f"{what}{config_message(pod, spec, namespace)}", timeout, gives_up)
    return None


def image_blocked(job: JobSummary) -> PodSummary | None:
    """The first pod of the Job whose image cannot start now, if any."""
    return next((p for p in job.pods if p.image_problem), None)


def image_message(pod: PodSummary) -> str:
    return f"pod {pod.name} cannot start image {pod.image!r}: {pod.image_problem}"


def image_gives_up(pod: PodSummary, *, since: datetime | None, now: datetime, timeout_seconds: int) -> bool:
    """True when waiting longer cannot help: a permanent cause, or a pull failing for the timeout."""
    if pod.image_permanent:
        return True
    return since is not None and (now - since).total_seconds() >= timeout_seconds


def config_blocked(job: JobSummary) -> PodSummary | None:
    """The first pod the kubelet cannot configure (CreateContainerConfigError: a Secret or key missing)."""
    return next((p for p in job.pods if p.config_problem), None)


def config_message(pod: PodSummary, spec: MemoryOptimizedTrainingJobSpec, namespace: str) -> str:
    """The kubelet's cause, led by the field that names the Secret when it is the hub token's."""
    message = f"pod {pod.name} cannot start: {pod.config_problem}"
    hf = spec.problem.huggingface
    ref = hf.token_secret_ref if hf is not None else None
    if ref is not None and ref.name in pod.config_problem:
        message = (f"spec.problem.huggingface.tokenSecretRef: Secret {namespace}/{ref.name} with key "
                   f"{ref.key!r} is needed by the pods; {message}")  # fmt: skip
    return message
