"""The snapshot a decision is taken on: everything the controller read for one MOTJ, as frozen values.

Which parts are read depends on where the job stands (`needs_*` below, used by the controller's
reader): a job being monitored needs its attempt's children, not the profile or the pools; one about
to profile or launch needs the profile cache, the profiling Job and the pools. A part that is None was
not read (or does not exist: the fields say which).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from memfit.api.common import ConditionStatus
from memfit.api.job import (
    Attempt,
    AttemptOutcome,
    MemoryOptimizedTrainingJobSpec,
    MemoryOptimizedTrainingJobStatus,
    Phase,
    PlanSummary,
)
from memfit.api.plan import Plan
from memfit.api.validation import violations_from
from memfit.kube.checkpoints import CheckpointStorage
from memfit.kube.child_fields import child_field_problems
from memfit.kube.common import RUN_AS_USER, Owner, PodSettings
from memfit.kube.names import MAX_JOB_NAME
from memfit.kube.profile_cache import CachedProfile
from memfit.lifecycle.conditions import PROFILED, find
from memfit.lifecycle.observed import JobSummary
from memfit.lifecycle.world import World

TERMINAL_PHASES = (Phase.SUCCEEDED, Phase.FAILED)


@dataclass(frozen=True, slots=True)
class JobRef:
    """The MOTJ's identity: what its children's names and ownerReferences are made of."""

    name: str
    namespace: str
    uid: str
    generation: int | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)

    def owner(self) -> Owner:
        return Owner(
            name=self.name, namespace=self.namespace, uid=self.uid, annotations=dict(self.annotations)
        )


PROGRESS_SECONDS = 15  # status.progress is refreshed about this often while the pods run (default)
# A training Job Kueue has not admitted past capacityTimeoutSeconds: another pool's quota is looked for
# (the ClusterQueue read and a planner run) at most this often, not on every resync.
QUOTA_RECHECK_SECONDS = 30


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """Operator-wide settings the children are built with (Helm values / flags)."""

    trainer_image: str
    image_pull_policy: str = "IfNotPresent"
    extra_pod_labels: Mapping[str, str] = field(default_factory=dict)
    service_account: str = ""
    checkpoints: CheckpointStorage = field(default_factory=CheckpointStorage)
    hub_endpoint: str = ""  # HF_ENDPOINT of the pods (chart value hub.endpoint: a mirror)
    fs_group: int = RUN_AS_USER  # chart value trainer.fsGroup
    fs_group_change_policy: str = "OnRootMismatch"  # chart value trainer.fsGroupChangePolicy
    progress_seconds: float = PROGRESS_SECONDS  # how often rank 0's metrics are read for status.progress

    def pod(self, spec: MemoryOptimizedTrainingJobSpec) -> PodSettings:
        return PodSettings(
            image=spec.image or self.trainer_image,
            image_pull_policy=self.image_pull_policy,
            extra_labels=dict(self.extra_pod_labels),
            service_account=self.service_account,
            hub_endpoint=self.hub_endpoint,
            fs_group=self.fs_group,
            fs_group_change_policy=self.fs_group_change_policy,
        )


@dataclass(frozen=True, slots=True)
class ClaimObserved:
    """The checkpoint PersistentVolumeClaim as read before a launch: whether it exists, its access modes."""

    name: str
    exists: bool
    access_modes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TrainerSample:
    """What rank 0's metrics endpoint served (memfit_trainer.metrics), for status.progress."""

    attempt: int  # the attempt the pod belongs to
    step: int
    loss: float | None = None
    eval_loss: float | None = None
    tokens_per_second: float | None = None  # rank 0's own rate
    step_seconds_sum: float = 0.0
    step_count: int = 0  # steps this pod timed (a resumed pod starts again at 0)
    resumed_from_step: int | None = None
    pod: str = ""  # the rank-0 pod that served it


@dataclass(frozen=True, slots=True)
class AttemptChildren:
    """The children of the attempt being monitored."""

    index: int
    job: JobSummary | None  # the training Job `<job>-train-<index>` and its pods; None = missing
    plan: Plan | None  # from the plan ConfigMap, else the copy annotated on the training Job
    plan_recorded: bool  # the plan ConfigMap `<job>-plan-<index>` exists
    trainer: TrainerSample | None = None  # rank 0's metrics, read when status.progress is due


@dataclass(frozen=True, slots=True)
class RecordedPlan:
    """A plan ConfigMap of the attempt about to launch that already exists: the record of a decision
    taken before a crash (or before the status was lost). That decision holds."""

    plan: Plan
    summary: PlanSummary | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the controller read for one reconcile of one MOTJ."""

    job: JobRef
    spec: MemoryOptimizedTrainingJobSpec | None  # None when it does not parse (see spec_problems)
    spec_problems: tuple[str, ...]
    status: MemoryOptimizedTrainingJobStatus
    now: datetime  # whole seconds (conditions and attempts store seconds)
    settings: LaunchSettings
    world: World | None = None  # pools and capacity; None = not read
    profile_cache: CachedProfile | None = None  # the problem's cached profile; None = none (or not read)
    # The key the job's profile is (or will be) cached under, computed once by the reader: the key its
    # cached profile was found under (a depth-reduced job may use a full-depth profile), else its own.
    profile_digest: str = ""
    profiling: JobSummary | None = None  # the profiling Job `<job>-profile`; None = none (or not read)
    attempt: AttemptChildren | None = None  # read while an attempt is active
    recorded_plan: RecordedPlan | None = None  # the next attempt's plan ConfigMap, if it exists
    checkpoint_claim: ClaimObserved | None = None  # read before a launch; None = not read (emptyDir)
    # (field, claim) of the model, data and output claims the job names that do not exist (read before
    # profiling and launching; empty when all exist or none are named)
    missing_claims: tuple[tuple[str, str], ...] = ()
    # A Failed job's child Jobs that may still hold or wait for GPUs (lifecycle.release); read only then
    leftovers: tuple[JobSummary, ...] = ()

    def pools(self) -> World:
        """The world; a decision that needs it on a snapshot read without it is a reader bug."""
        if self.world is None:
            raise SnapshotIncomplete("the decision needs the pools, and the snapshot was read without them")
        return self.world


class SnapshotIncomplete(RuntimeError):
    """The decision needs a part of the snapshot the reader did not read (a reader bug)."""


def parse_spec(
    name: str, raw: Mapping[str, Any] | None
) -> tuple[MemoryOptimizedTrainingJobSpec | None, list[str]]:
    """The spec, or None, and every semantic problem (each one a `path: message` line)."""
    problems: list[str] = []
    if len(name) > MAX_JOB_NAME:
        problems.append(f"metadata.name: at most {MAX_JOB_NAME} characters so that child names stay valid")
    try:
        spec = MemoryOptimizedTrainingJobSpec.model_validate(dict(raw or {}))
    except ValidationError as error:
        return None, problems + [str(v).removeprefix("spec: ") for v in violations_from(error, "spec")]
    return spec, problems + child_field_problems(spec)


def parse_status(raw: Mapping[str, Any] | None) -> MemoryOptimizedTrainingJobStatus | None:
    """The stored status, or None when it does not parse (the decision then starts from scratch)."""
    try:
        return MemoryOptimizedTrainingJobStatus.model_validate(dict(raw or {}))
    except ValidationError:
        return None


def current_attempt(status: MemoryOptimizedTrainingJobStatus) -> Attempt | None:
    return status.attempts[-1] if status.attempts else None


def is_terminal(status: MemoryOptimizedTrainingJobStatus) -> bool:
    return status.phase in TERMINAL_PHASES


def monitoring(status: MemoryOptimizedTrainingJobStatus) -> Attempt | None:
    """The attempt to monitor: the last one while it is Launching or Running."""
    attempt = current_attempt(status)
    return attempt if attempt is not None and attempt.outcome.active else None


def next_attempt_index(status: MemoryOptimizedTrainingJobStatus) -> int:
    return len(status.attempts)


def needs_quota_to_monitor(
    job: JobSummary | None, status: MemoryOptimizedTrainingJobStatus, spec: MemoryOptimizedTrainingJobSpec,
    now: datetime,
) -> bool:
    """A training Job Kueue has not admitted for capacityTimeoutSeconds: the monitor looks for another
    pool whose quota could hold the job (memfit.lifecycle.queued), with the pools, the queue's quota
    and the profile."""
    if job is None or not job.queue or not job.suspended or job.finished or not status.attempts:
        return False
    attempt = status.attempts[-1]
    if attempt.outcome == AttemptOutcome.RUNNING:
        return False  # evicted after running: Kueue re-queues it (memfit.lifecycle.queued)
    started, checked = attempt.started_at, attempt.quota_checked_at
    if started is None or (now - started).total_seconds() < spec.recovery.capacity_timeout_seconds:
        return False
    return checked is None or (now - checked).total_seconds() >= QUOTA_RECHECK_SECONDS


def needs_profile_cache_to_learn(job: JobSummary | None) -> bool:
    """A monitored attempt that finished or ran out of memory stores its measured peak with the
    profile (read-modify-write of the cache), so the reader reads the cache for it."""
    return job is not None and (job.finished or any(p.out_of_memory or p.over_plan for p in job.pods))


def needs_profiling_job(
    status: MemoryOptimizedTrainingJobStatus,
    spec: MemoryOptimizedTrainingJobSpec,
    cache: CachedProfile | None,
) -> bool:
    """The profile step looks at the profiling Job unless the cached profile is used: this job's own
    measurement is in the cache (Profiled=True), or `profiling.reuse` allows an older one."""
    if cache is None:
        return True
    profiled = find(status.conditions, PROFILED)
    return not ((profiled is not None and profiled.status == ConditionStatus.TRUE) or spec.profiling.reuse)




def needs_progress(
    status: MemoryOptimizedTrainingJobStatus, now: datetime, every: float = PROGRESS_SECONDS
) -> bool:
    """Rank 0's metrics are read when the progress is older than `every` seconds (the operator setting
    progress_seconds, PROGRESS_SECONDS by default) or missing."""
    progress = status.progress
    return progress is None or (now - progress.updated_at).total_seconds() >= every


def needs_world_to_monitor(children: AttemptChildren) -> bool:
    """Rebuilding a deleted training Job needs its pool; monitoring an existing one does not."""
    return children.job is None and children.plan is not None
