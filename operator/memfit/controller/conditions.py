"""Status conditions (metav1.Condition shape): set one, keeping lastTransitionTime when unchanged."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

PROFILED = "Profiled"
PLANNED = "Planned"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
ALL_TYPES = (PROFILED, PLANNED, RUNNING, SUCCEEDED, FAILED)

# Reasons (CamelCase, specific).
INVALID_SPEC = "InvalidSpec"
PROFILING = "Profiling"
PROFILE_CACHED = "ProfileCached"
PROFILE_MEASURED = "ProfileMeasured"
PROFILING_FAILED = "ProfilingFailed"
PROFILING_RESCHEDULED = "ProfilingRescheduled"
PLAN_FOUND = "PlanFound"
NO_FIT = "NoFit"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
WAITING_FOR_ADMISSION = "WaitingForAdmission"
LAUNCHING = "Launching"
PODS_RUNNING = "PodsRunning"
PODS_PENDING = "PodsPending"
TRAINING_SUCCEEDED = "TrainingSucceeded"
TRAINING_FAILED = "TrainingFailed"
OUT_OF_MEMORY = "OutOfMemory"
NO_CAPACITY = "NoCapacity"
REPLANS_EXHAUSTED = "ReplansExhausted"
PODS_NOT_CREATED = "PodsNotCreated"
REPLANNING = "Replanning"
INVALID_PLAN = "InvalidPlan"
NOT_YET = "NotYet"


def now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]],
    *,
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Return a new list with the condition set; lastTransitionTime only moves when status changes."""
    text = "Unknown" if status is None else ("True" if status else "False")
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") != type_:
            out.append(cond)
            continue
        found = True
        transition = cond.get("lastTransitionTime") if cond.get("status") == text else now_iso(now)
        out.append(_condition(type_, text, reason, message[:32768], generation, transition or now_iso(now)))
    if not found:
        out.append(_condition(type_, text, reason, message[:32768], generation, now_iso(now)))
    order = {t: i for i, t in enumerate(ALL_TYPES)}
    return sorted(out, key=lambda c: order.get(str(c.get("type")), len(order)))


def _condition(
    type_: str, status: str, reason: str, message: str, generation: int | None, transition: str
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def initial_conditions(generation: int | None, now: datetime) -> list[dict[str, Any]]:
    """Every condition Unknown on first visit (API conventions)."""
    conds: list[dict[str, Any]] = []
    for type_ in ALL_TYPES:
        conds = set_condition(
            conds, type_=type_, status=None, reason=NOT_YET, message="", generation=generation, now=now
        )
    return conds
