"""What a decision returns: the new status, the writes to make (in order) and the events."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from memfit.api.job import AttemptOutcome, MemoryOptimizedTrainingJobStatus

Manifest = dict[str, Any]


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class Event:
    """A Kubernetes Event on the MOTJ."""

    type: EventType
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Ensure:
    """Create the child unless it exists (a 409 with our owner is success).

    `record`: the child is the durable record of a decision (the plan ConfigMap); if it exists with
    other content, that earlier decision holds and the rest of this decision must not be applied."""

    manifest: Manifest
    record: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete a child Job (background propagation; a 404 is success)."""

    name: str


@dataclass(frozen=True, slots=True)
class WriteData:
    """Create the ConfigMap, or replace its data when it exists (the shared profile cache).

    `exists`: the snapshot saw it, so its data is replaced straight away (one write, no create)."""

    manifest: Manifest
    exists: bool = False


@dataclass(frozen=True, slots=True)
class SetAdmissionCheck:
    """Set one AdmissionCheck's state on a Kueue Workload (server-side apply of its own entry of
    `status.admissionChecks`): memfit's answer to the memory-fit check (lifecycle.admission)."""

    namespace: str
    workload: str
    check: str
    state: str  # Ready | Retry | Rejected
    message: str
    now: str  # lastTransitionTime (RFC 3339)


@dataclass(frozen=True, slots=True)
class PostEvent:
    """An Event about another object than the MOTJ (a Job memfit did not launch); best effort, posted by
    the operator's event poster."""

    involved: Manifest  # apiVersion, kind, name, namespace, uid
    type: EventType
    reason: str
    message: str


Effect = Ensure | Delete | WriteData | SetAdmissionCheck | PostEvent


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision: apply `effects` in order, then patch `status` (when it changed), then post events.

    The order is the crash-safety contract: every write a later reconcile must see (the plan record,
    a measured profile) comes before the status that refers to it, and a Job is deleted only once its
    attempt's outcome is in the stored status."""

    status: MemoryOptimizedTrainingJobStatus
    effects: tuple[Effect, ...] = ()
    events: tuple[Event, ...] = ()
    profile_seconds: float | None = None  # the profiler's wall time, when this decision read its result
    requeue: bool = False  # reconcile again right after this one is stored (a re-plan or a release is due)
    # When nothing the operator watches changes, look again after this many seconds (None: at the
    # operator's resync interval). Set for a training Job whose pods all run: every change that still
    # matters (a pod failed, finished, evicted or replaced; Kueue suspending it) shows in the Job's status,
    # which is watched, so the resync only refreshes status.progress (progress_seconds).
    recheck_after: float | None = None
    # What the operator's counters record for this decision (memfit_replans_total,
    # memfit_profiling_failures_total): the handlers count these, never event reasons.
    replans: tuple[AttemptOutcome, ...] = ()
    profiling_failed: bool = False

    def changed(self, old: MemoryOptimizedTrainingJobStatus | None) -> bool:
        return old != self.status

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]
