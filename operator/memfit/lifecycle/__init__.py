"""PURE: the lifecycle of a MemoryOptimizedTrainingJob as decisions on snapshots.

`decide(Snapshot) -> Decision`: the controller reads the job, its children, the pools and the clock
into a frozen `Snapshot`; `decide` returns the new status (`MemoryOptimizedTrainingJobStatus`), the
children to ensure or delete (manifests from `memfit.kube`) and the events. No kopf, no Kubernetes
client, no clock: every lifecycle rule is a unit test (tests/unit/lifecycle). Kueue's reconcilers
have the same shape (decide on a snapshot, apply the effects after).
"""

from __future__ import annotations

from memfit.lifecycle.decide import decide
from memfit.lifecycle.result import Decision, Delete, Effect, Ensure, Event, EventType, WriteData
from memfit.lifecycle.snapshot import AttemptChildren, JobRef, LaunchSettings, RecordedPlan, Snapshot
from memfit.lifecycle.world import PoolCapacity, World

__all__ = [
    "AttemptChildren",
    "Decision",
    "Delete",
    "Effect",
    "Ensure",
    "Event",
    "EventType",
    "JobRef",
    "LaunchSettings",
    "PoolCapacity",
    "RecordedPlan",
    "Snapshot",
    "World",
    "WriteData",
    "decide",
]
