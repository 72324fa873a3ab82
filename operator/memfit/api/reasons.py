"""Why: the one vocabulary of condition and Event reasons (CamelCase, like Kubernetes reasons).

The lifecycle sets conditions and posts Events with these; the status, the metrics and the docs read
them. `AttemptOutcome` (api/job.py) names how an attempt ended with the same words where they are the
same thing (OutOfMemory, MemoryOverPlan, NoCapacity). Kubernetes' and Kueue's own reasons (a Workload's
Pending, Inadmissible, QuotaReserved) are shown as they come and are not listed here.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Reasons of memfit's conditions and Events."""

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
    WAITING_FOR_VOLUME = "WaitingForVolume"  # pods wait for a claim to be bound: not counted as missing capacity
    TRAINING_SUCCEEDED = "TrainingSucceeded"
    TRAINING_FAILED = "TrainingFailed"
    OUT_OF_MEMORY = "OutOfMemory"
    MEMORY_OVER_PLAN = "MemoryOverPlan"  # first steps measured above prediction + headroom: re-plan before an OOM
    NO_CAPACITY = "NoCapacity"
    REPLANS_EXHAUSTED = "ReplansExhausted"
    RANK_FAILED = "RankFailed"  # a rank of a multi-node plan failed: every rank restarts from the checkpoint
    RESTARTS_EXHAUSTED = "RestartsExhausted"  # more rank failures than recovery.maxRestarts
    # A rank of a multi-node plan was disrupted (its node drained, lost or pre-empted): re-planned onto the
    # capacity left, every rank resumes from the checkpoint (a re-plan: recovery.maxReplans).
    RANK_DISRUPTED = "RankDisrupted"
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
    POD_REPLACED = "PodReplaced"  # a new rank-0 pod of the same attempt (Event, lifecycle.progress)
    RESUMED = "Resumed"  # a new pod loaded a checkpoint (Event)
    GPUS_RELEASED = "GPUsReleased"  # a Failed job's unfinished child Jobs were deleted (lifecycle.release)
    INPUT_CLAIM_MISSING = "VolumeClaimMissing"  # a model, data or output claim the job names does not exist (yet)
