"""A pod whose image cannot start: a condition naming the image and the cause, never a silent wait.

`ErrImageNeverPull` (pull policy `Never`, image not on the node) and `InvalidImageName` can never
resolve: the job fails at once. `ErrImagePull` / `ImagePullBackOff` may be a registry hiccup: the job
shows the cause in a condition and fails once it lasted `recovery.capacityTimeoutSeconds`.
"""

from __future__ import annotations

from datetime import datetime

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
