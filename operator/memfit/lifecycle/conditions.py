"""Status conditions (metav1.Condition shape): types, CamelCase reasons, and setting one while keeping
lastTransitionTime when its status did not change."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from memfit.api.common import Condition, ConditionStatus
from memfit.api.reasons import Reason

PROFILED = "Profiled"
PLANNED = "Planned"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CHECKPOINT_STORAGE = "CheckpointStorage"  # which volume holds the checkpoints and what it allows
ALL_TYPES = (PROFILED, PLANNED, RUNNING, SUCCEEDED, FAILED)
# Only on jobs with scheduling.kueueQueue (memfit.lifecycle.queueing): True while a child Job waits in
# the queue, its reason the Workload's (Kueue's CamelCase: Pending, Inadmissible, QuotaReserved...).
QUEUED = "Queued"

# Reasons: the one enum in api/reasons.py (aliases, so the lifecycle reads `c.NO_FIT`).
INVALID_SPEC = Reason.INVALID_SPEC
PROFILING = Reason.PROFILING
PROFILE_CACHED = Reason.PROFILE_CACHED
PROFILE_MEASURED = Reason.PROFILE_MEASURED
PROFILING_FAILED = Reason.PROFILING_FAILED
PROFILING_RESCHEDULED = Reason.PROFILING_RESCHEDULED
ANALYTIC_ONLY = Reason.ANALYTIC_ONLY
PLAN_FOUND = Reason.PLAN_FOUND
NO_FIT = Reason.NO_FIT
WAITING_FOR_CAPACITY = Reason.WAITING_FOR_CAPACITY
WAITING_FOR_ADMISSION = Reason.WAITING_FOR_ADMISSION
NO_QUOTA = Reason.NO_QUOTA
ADMITTED = Reason.ADMITTED
LAUNCHING = Reason.LAUNCHING
PODS_RUNNING = Reason.PODS_RUNNING
PODS_PENDING = Reason.PODS_PENDING
WAITING_FOR_VOLUME = Reason.WAITING_FOR_VOLUME
TRAINING_SUCCEEDED = Reason.TRAINING_SUCCEEDED
TRAINING_FAILED = Reason.TRAINING_FAILED
OUT_OF_MEMORY = Reason.OUT_OF_MEMORY
MEMORY_OVER_PLAN = Reason.MEMORY_OVER_PLAN
NO_CAPACITY = Reason.NO_CAPACITY
REPLANS_EXHAUSTED = Reason.REPLANS_EXHAUSTED
RANK_FAILED = Reason.RANK_FAILED
RESTARTS_EXHAUSTED = Reason.RESTARTS_EXHAUSTED
RANK_DISRUPTED = Reason.RANK_DISRUPTED
PODS_NOT_CREATED = Reason.PODS_NOT_CREATED
REPLANNING = Reason.REPLANNING
INVALID_PLAN = Reason.INVALID_PLAN
IMAGE_UNAVAILABLE = Reason.IMAGE_UNAVAILABLE
CONTAINER_CONFIG_ERROR = Reason.CONTAINER_CONFIG_ERROR
IMAGE_PULL_FAILING = Reason.IMAGE_PULL_FAILING
NOT_YET = Reason.NOT_YET
SHARED_VOLUME = Reason.SHARED_VOLUME
SINGLE_NODE_VOLUME = Reason.SINGLE_NODE_VOLUME
EPHEMERAL_CHECKPOINTS = Reason.EPHEMERAL_CHECKPOINTS
CHECKPOINT_CLAIM_MISSING = Reason.CHECKPOINT_CLAIM_MISSING
POD_REPLACED = Reason.POD_REPLACED
RESUMED = Reason.RESUMED
GPUS_RELEASED = Reason.GPUS_RELEASED
INPUT_CLAIM_MISSING = Reason.INPUT_CLAIM_MISSING

MAX_MESSAGE = 32768


def status_of(value: bool | None) -> ConditionStatus:
    if value is None:
        return ConditionStatus.UNKNOWN
    return ConditionStatus.TRUE if value else ConditionStatus.FALSE


def set_condition(
    conditions: Sequence[Condition],
    *,
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Return a new list with the condition set; lastTransitionTime only moves when status changes."""
    wanted = status_of(status)
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        kept = cond.last_transition_time if cond.status == wanted else None
        out.append(_condition(type_, wanted, reason, message, generation, kept or now))
    if not found:
        out.append(_condition(type_, wanted, reason, message, generation, now))
    order = {t: i for i, t in enumerate(ALL_TYPES)}
    return sorted(out, key=lambda c: order.get(c.type, len(order)))


def _condition(
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    transition: datetime,
) -> Condition:
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message[:MAX_MESSAGE],
        observed_generation=generation,
        last_transition_time=transition,
    )


def initial_conditions(generation: int | None, now: datetime) -> list[Condition]:
    """Every condition Unknown on first visit (API conventions)."""
    conds: list[Condition] = []
    for type_ in ALL_TYPES:
        conds = set_condition(
            conds, type_=type_, status=None, reason=NOT_YET, message="", generation=generation, now=now
        )
    return conds


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
