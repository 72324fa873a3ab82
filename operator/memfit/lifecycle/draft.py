"""The status a decision is building, and the effects and events that go with it (one per decide call)."""

from __future__ import annotations

from datetime import datetime

from memfit.api.common import Condition, ConditionStatus
from memfit.api.job import (
    Attempt,
    AttemptOutcome,
    MemoryOptimizedTrainingJobStatus,
    Phase,
    PlanSummary,
    ProfileSummary,
    Progress,
    SpendItem,
)
from memfit.lifecycle import conditions as c
from memfit.lifecycle.result import Decision, Effect, Event, EventType
from memfit.lifecycle.spend import spend_of

MAX_STATUS_MESSAGE = 4096
MAX_ATTEMPT_REASON = 1024


class Draft:
    """A mutable working copy of the status inside one pure decision; `decision()` freezes it."""

    def __init__(
        self, status: MemoryOptimizedTrainingJobStatus, *, generation: int | None, now: datetime
    ) -> None:
        self.generation = generation
        self.now = now
        self.phase: Phase = status.phase
        self.stored_phase: Phase = status.phase
        self.message = status.message
        self.conditions: list[Condition] = list(status.conditions) or c.initial_conditions(generation, now)
        self.profile: ProfileSummary | None = status.profile
        self.plan: PlanSummary | None = status.plan
        self.attempts: list[Attempt] = list(status.attempts)
        self.measured_peak_bytes = status.measured_peak_bytes
        self.progress: Progress | None = status.progress
        self.checkpoint_claim: str | None = status.checkpoint_claim
        spent = status.spend.items if status.spend else []
        self.profiling_spend: SpendItem | None = next((i for i in spent if i.kind == "profiling"), None)
        self.effects: list[Effect] = []
        self.events: list[Event] = []
        self.profile_seconds: float | None = None
        self.replans: list[AttemptOutcome] = []  # attempts this decision ended for a re-plan (metrics)
        self.profiling_failed = False
        # Seconds until the next look this job needs when no watched object changes (None: the operator's
        # resync interval); set when everything that can still happen shows in the Job's status.
        self.recheck_after: float | None = None

    # --- conditions and phase ----------------------------------------------------------------------
    def set(self, type_: str, value: bool | None, reason: str, message: str) -> None:
        self.conditions = c.set_condition(
            self.conditions,
            type_=type_,
            status=value,
            reason=reason,
            message=message,
            generation=self.generation,
            now=self.now,
        )

    def condition_is(self, type_: str, value: bool) -> bool:
        cond = c.find(self.conditions, type_)
        return cond is not None and cond.status == c.status_of(value)

    def condition_reason(self, type_: str) -> str | None:
        cond = c.find(self.conditions, type_)
        return cond.reason if cond is not None else None

    def false_since(self, type_: str) -> datetime | None:
        """When the condition last became False (None unless it is False now)."""
        cond = c.find(self.conditions, type_)
        if cond is None or cond.status != ConditionStatus.FALSE:
            return None
        return cond.last_transition_time

    def true_since(self, type_: str) -> datetime | None:
        """When the condition last became True (None unless it is True now)."""
        cond = c.find(self.conditions, type_)
        if cond is None or cond.status != ConditionStatus.TRUE:
            return None
        return cond.last_transition_time

    def enter(self, phase: Phase, message: str) -> None:
        self.phase = phase
        self.message = message[:MAX_STATUS_MESSAGE]

    def fail(self, reason: str, message: str) -> None:
        """Failed with the reason (once: a job already Failed keeps its first reason)."""
        if self.phase == Phase.FAILED and self.condition_is(c.FAILED, True):
            return
        self.profiling_failed = reason == c.PROFILING_FAILED
        self.set(c.FAILED, True, reason, message)
        self.set(c.SUCCEEDED, False, reason, message)
        self.set(c.RUNNING, False, reason, message)
        self.enter(Phase.FAILED, f"{reason}: {message}")
        self.event(reason, message, warning=True)

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(Event(EventType.WARNING if warning else EventType.NORMAL, reason, message))

    # --- attempts ----------------------------------------------------------------------------------
    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def update_current(self, **changes: object) -> None:
        current = self.current
        assert current is not None
        self.attempts[-1] = current.model_copy(update=changes)

    def finish_attempt(
        self, outcome: AttemptOutcome, *, measured: int | None = None, reason: str = ""
    ) -> None:
        changes: dict[str, object] = {
            "outcome": outcome,
            "finished_at": self.now,
            "reason": reason[:MAX_ATTEMPT_REASON],
        }
        if measured is not None:
            changes["measured_peak_bytes"] = measured
        if outcome.replans:
            self.replans.append(outcome)
        self.update_current(**changes)

    def decision(self) -> Decision:
        status = MemoryOptimizedTrainingJobStatus(
            observed_generation=self.generation,
            phase=self.phase,
            conditions=self.conditions,
            profile=self.profile,
            plan=self.plan,
            attempts=self.attempts,
            measured_peak_bytes=self.measured_peak_bytes,
            spend=spend_of(self.profiling_spend, self.attempts, self.plan),
            progress=self.progress,
            checkpoint_claim=self.checkpoint_claim,
            message=self.message,
        )
        return Decision(
            status=status,
            effects=tuple(self.effects),
            events=tuple(self.events),
            profile_seconds=self.profile_seconds,
            requeue=self._requeue(),
            recheck_after=self.recheck_after,
            replans=tuple(self.replans),
            profiling_failed=self.profiling_failed,
        )

    def _requeue(self) -> bool:
        """Reconcile again at once (the echo of our own status patch is skipped): a finished attempt
        whose re-plan is due, or a job that just failed, whose unfinished children the next pass
        deletes (lifecycle.release) once Failed is stored."""
        if self.phase == Phase.FAILED:
            return self.stored_phase != Phase.FAILED
        terminal = self.phase == Phase.SUCCEEDED
        return not terminal and bool(self.attempts) and self.attempts[-1].outcome.replans
