"""Status conditions (metav1.Condition shape): types, CamelCase reasons, and setting one while keeping
lastTransitionTime when its status did not change."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from memfit.api.common import Condition, ConditionStatus

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

# Reasons (CamelCase, specific).
INVALID_SPEC = "InvalidSpec"
PROFILING = "Profiling"
PROFILE_CACHED = "ProfileCached"
PROFILE_MEASURED = "ProfileMeasured"
PROFILING_FAILED = "ProfilingFailed"
PROFILING_RESCHEDULED = "ProfilingRescheduled"
ANALYTIC_ONLY = "AnalyticOnly"  # nothing could be profiled: planned from the analytic model, more headroom
PLAN_FOUND = "PlanFound"
NO_FIT = "NoFit"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
WAITING_FOR_ADMISSION = "WaitingForAdmission"
NO_QUOTA = "NoQuota"  # Kueue did not admit the job on its pool for capacityTimeoutSeconds: moved to another
ADMITTED = "Admitted"  # Queued=False: Kueue admitted the child Job
LAUNCHING = "Launching"
PODS_RUNNING = "PodsRunning"
PODS_PENDING = "PodsPending"
TRAINING_SUCCEEDED = "TrainingSucceeded"
TRAINING_FAILED = "TrainingFailed"
OUT_OF_MEMORY = "OutOfMemory"
MEMORY_OVER_PLAN = "MemoryOverPlan"  # first steps measured above prediction + headroom: re-plan before an OOM
NO_CAPACITY = "NoCapacity"
REPLANS_EXHAUSTED = "ReplansExhausted"
PODS_NOT_CREATED = "PodsNotCreated"
REPLANNING = "Replanning"
INVALID_PLAN = "InvalidPlan"
IMAGE_UNAVAILABLE = "ImageUnavailable"  # the image cannot start (not on the node, invalid, pull failing)
CONTAINER_CONFIG_ERROR = "ContainerConfigError"  # a Secret/ConfigMap or key the pods name is missing
IMAGE_PULL_FAILING = "ImagePullFailing"  # a pull is failing; the job fails if it lasts capacityTimeoutSeconds
NOT_YET = "NotYet"
SHARED_VOLUME = "SharedVolume"  # ReadWriteMany: every node of a multi-node plan reads and writes it
SINGLE_NODE_VOLUME = "SingleNodeVolume"  # ReadWriteOnce: plans are kept to one node
EPHEMERAL_CHECKPOINTS = "EphemeralCheckpoints"  # emptyDir, asked for: no resume across pods
CHECKPOINT_CLAIM_MISSING = "CheckpointClaimMissing"  # the named claim does not exist (yet)
GPUS_RELEASED = "GPUsReleased"  # a Failed job's unfinished child Jobs were deleted (lifecycle.release)
INPUT_CLAIM_MISSING = "VolumeClaimMissing"  # a model, data or output claim the job names does not exist (yet)

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
