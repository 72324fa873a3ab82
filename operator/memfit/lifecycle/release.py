"""A Failed job gives its GPUs back: the children that still hold or wait for GPUs are deleted.

Terminal jobs keep their record (status, events, the plan ConfigMaps, finished Jobs) for inspection,
but a training or profiling Job that has not finished still holds GPUs (a pod stuck in
CreateContainerConfigError or ImagePullBackOff keeps its `nvidia.com/gpu`) or waits for them (a
Pending pod, a Kueue Workload). The deletion runs in the reconcile after the one that stored Failed,
so a crash in between cannot relaunch it (the order contract of lifecycle.result)."""

from __future__ import annotations

from memfit.api.job import MemoryOptimizedTrainingJobStatus, Phase
from memfit.kube.names import profile_job_name, train_job_name
from memfit.lifecycle import conditions as c
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.result import Delete
from memfit.lifecycle.snapshot import Snapshot

RELEASED = "GPUs released"


def release_candidates(job: str, status: MemoryOptimizedTrainingJobStatus) -> tuple[str, ...]:
    """The children of a Failed job that may still hold or wait for GPUs (the reader reads these):
    the last attempt's training Job and the profiling Job. Succeeded jobs finished every pod."""
    if status.phase != Phase.FAILED:
        return ()
    names = [profile_job_name(job)]
    if status.attempts:
        names.append(train_job_name(job, status.attempts[-1].index))
    return tuple(names)


def release_step(draft: Draft, snap: Snapshot) -> None:
    """Delete each unfinished child Job of a Failed job, say so once in the message and an Event."""
    live = [job for job in snap.leftovers if not job.finished and not job.deleting]
    if not live:
        return
    for job in live:
        draft.effects.append(Delete(job.name))
    pods = sum(1 for job in live for p in job.pods if p.phase in ("Pending", "Running"))
    names = ", ".join(job.name for job in live)
    msg = (
        f"deleted unfinished Job(s) {names} of the failed job ({pods} pod(s) holding or waiting for GPUs); "
        "status, events and the plan ConfigMaps stay for inspection"
    )
    draft.event(c.GPUS_RELEASED, msg)
    if RELEASED not in draft.message:
        draft.enter(draft.phase, f"{draft.message} ({RELEASED}: {names} deleted)")
