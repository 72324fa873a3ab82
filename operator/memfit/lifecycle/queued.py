"""A training Job Kueue does not admit: after capacityTimeoutSeconds in its LocalQueue, memfit moves the
job to another pool whose quota can hold a plan now, and otherwise keeps it queued (pure).

Kueue admits a Workload on a flavor (= a pool, `memfit kueue flavors`) only while the ClusterQueue has
quota there. A job whose pool stays without quota keeps its place in the queue unless another allowed
pool has free quota for a plan right now: leaving the queue for a pool that is just as full would lose
the place for nothing. The move is a re-plan like a pool without capacity (attempt outcome
NoCapacity, that pool excluded), so the global batch and the checkpoints carry over.
"""

from __future__ import annotations

from memfit.api.job import AttemptOutcome, MemoryOptimizedTrainingJobSpec, Phase
from memfit.api.plan import Plan
from memfit.lifecycle import conditions as c
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.observed import JobSummary
from memfit.lifecycle.planning import plan_job
from memfit.lifecycle.snapshot import Snapshot


def move_if_another_pool_has_quota(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, plan: Plan, job: JobSummary
) -> bool:
    """True when the attempt was ended to re-plan onto another pool with quota (the caller stops);
    False while the job should keep waiting in its queue (the Running condition then says why)."""
    current = draft.current
    world, cache = snap.world, snap.profile_cache
    if current is None or current.started_at is None or world is None:
        return False  # not due (the reader read no pools: lifecycle.snapshot.needs_quota_to_monitor)
    if current.outcome == AttemptOutcome.RUNNING:
        return False  # it ran, and Kueue evicted it: Kueue re-queues it where it ran, with its checkpoints
    waited = int((snap.now - current.started_at).total_seconds())
    timeout = spec.recovery.capacity_timeout_seconds
    if waited < timeout:
        return False
    quota = world.queue_quota
    if quota is None or cache is None:
        # No ClusterQueue quota (or profile) to compare against: look again QUOTA_RECHECK_SECONDS later.
        draft.update_current(quota_checked_at=snap.now)
        return False
    excluded = frozenset(a.node_pool for a in draft.attempts if a.outcome == AttemptOutcome.NO_CAPACITY)
    outcome = plan_job(
        spec=spec,
        profile=cache.profile,
        pools=world.pools,
        capacity=world.capacity,
        excluded_pools=excluded | {plan.node_pool},
        observations=cache.observations,
        attempt=len(draft.attempts),
        job_name=snap.job.name,
        catalog=world.catalog,
        quota=quota,
        unusable=world.unusable_pools(),
    )
    # The condition's message stays the same while nothing changes (no status write per resync).
    waiting = (f"LocalQueue {job.queue} has not admitted training Job {job.name} on {plan.node_pool} within "
               f"capacityTimeoutSeconds ({timeout}s; {quota.describe()})")  # fmt: skip
    if outcome.plan is None:
        draft.set(c.RUNNING, False, c.WAITING_FOR_ADMISSION,
                  f"{waiting}; no other pool's quota can hold the job now: it keeps its place in the queue")  # fmt: skip
        draft.update_current(quota_checked_at=snap.now)  # the next look is QUOTA_RECHECK_SECONDS away
        return False
    reason = (f"LocalQueue {job.queue} has not admitted training Job {job.name} on {plan.node_pool} for {waited}s "
              f"(capacityTimeoutSeconds {timeout}; {quota.describe()}); {outcome.plan.node_pool} has quota for "
              f"{outcome.plan.describe()}")  # fmt: skip
    draft.finish_attempt(AttemptOutcome.NO_CAPACITY, reason=reason)
    draft.set(c.RUNNING, False, c.NO_QUOTA, reason)
    draft.enter(Phase.REPLANNING, f"attempt {plan.attempt}: {reason}; re-planning")
    draft.event(c.NO_QUOTA, reason, warning=True)
    return True
