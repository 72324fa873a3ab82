"""decide(snapshot) -> Decision: the whole lifecycle of a MOTJ as one pure function.

Validate, profile (or reuse a cached profile), plan and launch an attempt, monitor it, re-plan after
an OOM or a capacity timeout (at most `recovery.maxReplans` times), restart a multi-node gang after a
rank failed (at most `recovery.maxRestarts` times), and finish. The controller reads
the snapshot, applies the decision's effects in order, then patches the status when it changed.
"""

from __future__ import annotations

from contextlib import nullcontext

from memfit.api.job import AttemptOutcome, MemoryOptimizedTrainingJobSpec, Phase
from memfit.kube.names import train_job_name
from memfit.lifecycle import conditions as c
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.launch import Timer, launch_step
from memfit.lifecycle.monitor import monitor_step
from memfit.lifecycle.profiling import profile_step
from memfit.lifecycle.release import release_step
from memfit.lifecycle.result import Decision, Delete
from memfit.lifecycle.snapshot import Snapshot, SnapshotIncomplete, is_terminal


def decide(snap: Snapshot, *, timer: Timer = nullcontext) -> Decision:
    """The next status, the children to ensure or delete, and the events, for one snapshot.

    `timer` wraps each planner run (the operator times them for its metrics); nothing else here
    touches a clock or the cluster."""
    draft = Draft(snap.status, generation=snap.job.generation, now=snap.now)
    spec = snap.spec
    if is_terminal(snap.status):  # finished children stay for inspection; unfinished ones hold GPUs
        release_step(draft, snap)
    elif spec is None or snap.spec_problems:  # (an edit after the end changes nothing: it is over)
        draft.fail(c.INVALID_SPEC, "; ".join(snap.spec_problems))
    else:
        _advance(draft, snap, spec, timer)
    return draft.decision()


def _wait_for_claims(draft: Draft, snap: Snapshot) -> None:
    """A model, data or output claim the job names does not exist: no pod is created (it would stay
    Pending); the job waits in Planning, saying which field names which claim (the resync looks again)."""
    missing = "; ".join(
        f"{field}: PersistentVolumeClaim {snap.job.namespace}/{claim} does not exist" for field, claim in snap.missing_claims
    )
    msg = f"{missing}; create it (the job starts when it exists) or fix the field"
    if draft.condition_reason(c.PLANNED) != c.INPUT_CLAIM_MISSING:
        draft.event(c.INPUT_CLAIM_MISSING, msg, warning=True)
    draft.set(c.PLANNED, False, c.INPUT_CLAIM_MISSING, msg)
    draft.enter(Phase.PLANNING, msg)


def _advance(draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, timer: Timer) -> None:
    current = draft.current
    digest = snap.profile_digest
    if not digest:
        raise SnapshotIncomplete("the decision needs the profile digest, and the snapshot was read without it")
    if current is not None and current.outcome.active:
        monitor_step(draft, snap, spec, digest)
        return
    if snap.missing_claims:
        _wait_for_claims(draft, snap)
        return
    if draft.condition_reason(c.PLANNED) == c.INPUT_CLAIM_MISSING:
        draft.set(c.PLANNED, None, c.NOT_YET, "the claims the job names exist")
    profile = profile_step(draft, snap, spec, digest)
    if profile is None:
        return
    if current is not None and not current.outcome.replans:
        return  # Succeeded or Failed attempt: the phase says the rest
    if current is not None:
        # The attempt's outcome is in the stored status (the snapshot read it), so its Job can go now:
        # deleting it before the outcome was stored would let a crash in between relaunch it.
        draft.effects.append(Delete(train_job_name(snap.job.name, current.index)))
        restarts = sum(a.outcome == AttemptOutcome.RANK_FAILED for a in draft.attempts)  # not disruptions
        replans_used = len(draft.attempts) - restarts
        if current.outcome == AttemptOutcome.RANK_FAILED and restarts > spec.recovery.max_restarts:
            draft.fail(
                c.RESTARTS_EXHAUSTED,
                f"{restarts} rank failures, last: {current.reason}; "
                f"recovery.maxRestarts is {spec.recovery.max_restarts}",
            )
            return
        if current.outcome != AttemptOutcome.RANK_FAILED and replans_used > spec.recovery.max_replans:
            draft.fail(
                c.REPLANS_EXHAUSTED,
                f"{len(draft.attempts)} attempts, last: {current.reason}; "
                f"recovery.maxReplans is {spec.recovery.max_replans}",
            )
            return
    launch_step(draft, snap, spec, profile, timer=timer)
