"""The Queued condition: a child Job that waits in its Kueue LocalQueue, with its Workload's reason."""

from __future__ import annotations

from memfit.lifecycle import conditions as c
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.observed import JobSummary


def queue_step(draft: Draft, job: JobSummary, what: str) -> bool:
    """Set `Queued` from `job` (a queue-labelled child; `what` names it, "profiling Job"): True with the
    Workload's reason while Kueue has not admitted it (it is suspended), False `Admitted` once it has.
    Returns True while the Job waits. Jobs without a queue leave the condition alone."""
    if not job.queue or job.finished:
        return False
    if job.suspended:
        detail = f": {job.queue_message}" if job.queue_message else ""
        msg = f"{what} {job.name} waits in LocalQueue {job.queue} ({job.queue_reason}{detail})"
        if draft.condition_reason(c.QUEUED) != job.queue_reason or not draft.condition_is(c.QUEUED, True):
            draft.event(c.QUEUED, msg)
        draft.set(c.QUEUED, True, job.queue_reason, msg)
        return True
    if draft.condition_is(c.QUEUED, True) or draft.condition_reason(c.QUEUED) is None:
        draft.set(c.QUEUED, False, c.ADMITTED, f"{what} {job.name} admitted by Kueue from LocalQueue {job.queue}")
    return False
