"""A pod whose image cannot start: a condition naming the image and the cause, never a silent wait.

`ErrImageNeverPull` (pull policy `Never`, image not on the node) and `InvalidImageName` can never
resolve: the job fails at once. `ErrImagePull` / `ImagePullBackOff` may be a registry hiccup: the job
shows the cause in a condition and fails once it lasted `recovery.capacityTimeoutSeconds`.
"""

from __future__ import annotations

from datetime import datetime

from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.lifecycle.observed import JobSummary, PodSummary


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
