"""Read one MOTJ's snapshot: its children, pods, profile cache and the pools, as lifecycle values.

Reads follow where the job stands (lifecycle.snapshot's `needs_*`): a monitored attempt reads its
Job, plan ConfigMap and pods (the pools only to rebuild a deleted Job, the profile cache only to
learn a measured peak); a job before launch reads the profile cache, the profiling Job, the next
attempt's plan ConfigMap and the pools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from memfit.api import pod as contract
from memfit.api.job import MemoryOptimizedTrainingJobSpec, MemoryOptimizedTrainingJobStatus
from memfit.api.plan import Plan
from memfit.api.pool import GPUNodePool
from memfit.controller.kubeapi import KubeApi
from memfit.controller.parsed_bodies import spec_of
from memfit.controller.settings import OperatorSettings
from memfit.controller.world_cache import observe_world
from memfit.kube.checkpoints import CheckpointStorage, checkpoint_volume
from memfit.kube.kueue import LABEL_QUEUE
from memfit.kube.names import (
    COMPLETION_INDEX_ANNOTATION,
    COMPONENT_PROFILER,
    COMPONENT_TRAINER,
    LABEL_ATTEMPT,
    plan_config_map_name,
    profile_cache_name,
    profile_job_name,
    train_job_name,
)
from memfit.kube.profile_cache import CachedProfile
from memfit.kube.train_job import PLAN_KEY, named_claims, parse_plan_record
from memfit.lifecycle import AttemptChildren, JobRef, LaunchSettings, RecordedPlan, Snapshot, World
from memfit.lifecycle.launch import ANNOTATION_PLAN_JSON
from memfit.lifecycle.observed import LABEL_JOB_UID, JobSummary, pod_selector, summarize_job
from memfit.lifecycle.profiling import profile_key, profile_keys
from memfit.lifecycle.progress import trainer_sample
from memfit.lifecycle.quota import QueueQuota, cohort_of, parse_cluster_queue
from memfit.lifecycle.reads import monitor_reads, needs_fresh_pools, needs_pools_for_digest
from memfit.lifecycle.release import release_candidates
from memfit.lifecycle.snapshot import (
    ClaimObserved,
    TrainerSample,
    is_terminal,
    monitoring,
    needs_profiling_job,
    needs_progress,
    next_attempt_index,
    parse_status,
)
from memfit.mig import resource_name

Manifest = dict[str, Any]


class ChildReader(Protocol):
    """The reads a snapshot needs (KubeApi; an in-memory store in the lifecycle unit tests)."""

    def get_job(self, namespace: str, name: str) -> Manifest | None: ...
    def get_config_map(self, namespace: str, name: str) -> Manifest | None: ...
    def profile_cache(self, namespace: str, name: str) -> CachedProfile | None: ...
    def list_pods(self, namespace: str, selector: str) -> list[Manifest]: ...
    def list_job_pods(self, namespace: str, selector: str, job: Manifest) -> list[Manifest]: ...
    def get_claim(self, namespace: str, name: str) -> Manifest | None: ...
    def trainer_metrics(self, host: str, port: int, *, job: str) -> dict[str, float] | None: ...
    def list_workloads(self, namespace: str, selector: str) -> list[Manifest]: ...
    def get_local_queue(self, namespace: str, name: str) -> Manifest | None: ...
    def get_cluster_queue(self, name: str) -> Manifest | None: ...
    def list_cluster_queues(self) -> list[Manifest]: ...


def launch_settings(settings: OperatorSettings) -> LaunchSettings:
    return LaunchSettings(
        trainer_image=settings.trainer_image,
        image_pull_policy=settings.image_pull_policy,
        extra_pod_labels=dict(settings.extra_pod_labels),
        service_account=settings.trainer_service_account,
        checkpoints=CheckpointStorage(
            storage_class=settings.checkpoint_storage_class,
            access_mode=settings.checkpoint_access_mode,
            min_bytes=settings.checkpoint_min_bytes,
        ),
        hub_endpoint=settings.hub_endpoint,
        fs_group=settings.pod_fs_group,
        fs_group_change_policy=settings.pod_fs_group_change_policy,
        progress_seconds=settings.progress_seconds,
    )


def observe_snapshot(
    api: ChildReader,
    body: Manifest,
    *,
    settings: OperatorSettings,
    world: World | None = None,
    world_source: Callable[[], World] | None = None,
    now: datetime | None = None,
) -> Snapshot:
    """Read what the next decision about this MOTJ looks at.

    The pools come from `world`, else from `world_source` (the operator's shared snapshot), else from
    the API server."""
    meta = body["metadata"]
    ref = JobRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=meta.get("generation"),
        annotations=dict(meta.get("annotations") or {}),
    )
    spec, problems = spec_of(meta, body.get("spec"))
    status = parse_status(body.get("status")) or MemoryOptimizedTrainingJobStatus()
    snap = Snapshot(
        job=ref,
        spec=spec,
        spec_problems=problems,
        status=status,
        now=(now or datetime.now(UTC)).replace(microsecond=0),
        settings=launch_settings(settings),
    )
    if is_terminal(status):
        return replace(snap, leftovers=_leftovers(api, ref, status))
    if spec is None or problems:
        return snap
    pools = _Pools(api, world, world_source)
    active = monitoring(status)
    if active is not None:
        digest = profile_key(spec, status, snap.settings, pools.get() if needs_pools_for_digest(status) else None)
        progress_due = needs_progress(status, snap.now, snap.settings.progress_seconds)
        children = _attempt_children(api, ref, active.index, progress_due=progress_due)
        reads = monitor_reads(children, status, spec, snap.now)
        world_then = pools.get() if reads.pools else None
        if reads.queue_quota and world_then is not None:
            world_then = replace(world_then, queue_quota=_queue_quota(api, ref.namespace, reads.queue_quota,
                                                                      world_then.pools))
        return replace(
            snap,
            attempt=children,
            world=world_then,
            profile_digest=digest,
            profile_cache=_profile_cache(api, ref.namespace, digest) if reads.profile_cache else None,
        )
    world_now = pools.get()
    if needs_fresh_pools(spec, world_now):
        world_now = pools.fresh()
    if spec.scheduling.kueue_queue:
        world_now = replace(world_now, queue_quota=_queue_quota(api, ref.namespace, spec.scheduling.kueue_queue,
                                                                world_now.pools))
    cache, digest = None, ""
    for digest in profile_keys(spec, status, snap.settings, world_now):  # the lifecycle's order of keys
        cache = _profile_cache(api, ref.namespace, digest)
        if cache is not None:
            break
    return replace(
        snap,
        world=world_now,
        profile_cache=cache,
        profile_digest=digest,
        profiling=_profiling(api, ref) if needs_profiling_job(status, spec, cache) else None,
        recorded_plan=_recorded_plan(api, ref, next_attempt_index(status)),
        checkpoint_claim=_checkpoint_claim(api, ref, spec),
        missing_claims=tuple((f, claim) for f, claim in named_claims(spec) if api.get_claim(ref.namespace, claim) is None),
    )


def _leftovers(api: ChildReader, ref: JobRef, status: MemoryOptimizedTrainingJobStatus) -> tuple[JobSummary, ...]:
    """The child Jobs of a Failed job that may still hold or wait for GPUs, with their pods."""
    found = []
    for name in release_candidates(ref.name, status):
        job = api.get_job(ref.namespace, name)
        if job is None:
            continue
        summary = summarize_job(job, [], name, None)
        if summary.finished:
            continue  # holds nothing: kept for inspection, its pods not even listed
        labels = (job.get("metadata") or {}).get("labels") or {}
        attempt = labels.get(LABEL_ATTEMPT)
        component = COMPONENT_PROFILER if name == profile_job_name(ref.name) else COMPONENT_TRAINER
        selector = pod_selector(ref.name, component, int(attempt) if attempt and attempt.isdigit() else None)
        found.append(summarize_job(job, api.list_pods(ref.namespace, selector), name, None))
    return tuple(found)


def _checkpoint_claim(api: ChildReader, ref: JobRef, spec: MemoryOptimizedTrainingJobSpec) -> ClaimObserved | None:
    """The checkpoint claim (the user's, or memfit's from an earlier attempt); None for an emptyDir."""
    claim = checkpoint_volume(spec, ref.name).claim
    if claim is None:
        return None
    raw = api.get_claim(ref.namespace, claim)
    if raw is None:
        return ClaimObserved(claim, exists=False)
    modes = tuple(str(m) for m in (raw.get("spec") or {}).get("accessModes") or ())
    return ClaimObserved(claim, exists=True, access_modes=modes)


class _Pools:
    """The world, read at most once per reconcile and only when the snapshot needs it."""

    def __init__(self, api: ChildReader, world: World | None, source: Callable[[], World] | None) -> None:
        self._api, self._world, self._source = api, world, source

    def get(self) -> World:
        if self._world is None:
            self._world = self._source() if self._source is not None else observe_world(self._kube())
        return self._world

    def fresh(self) -> World:
        if self._source is not None:  # a world given by the caller is taken as it is
            self._world = observe_world(self._kube())
        return self.get()

    def _kube(self) -> KubeApi:
        assert isinstance(self._api, KubeApi), "without a world, the pools are read from the API server"
        return self._api


def _profile_cache(api: ChildReader, namespace: str, digest: str) -> CachedProfile | None:
    return api.profile_cache(namespace, profile_cache_name(digest))


def _profiling(api: ChildReader, ref: JobRef) -> JobSummary | None:
    name = profile_job_name(ref.name)
    job = api.get_job(ref.namespace, name)
    if job is None:
        return None
    pods = api.list_pods(ref.namespace, pod_selector(ref.name, COMPONENT_PROFILER))
    return summarize_job(job, pods, name, _workload(api, ref.namespace, job))


def _queue_quota(api: ChildReader, namespace: str, queue: str, pools: Sequence[GPUNodePool]) -> QueueQuota | None:
    """The GPU quota of the ClusterQueue behind LocalQueue `namespace/queue`, each pool's flavor read in
    the resource the pool's pods request (a MIG pool's slices); None when either is missing or
    unreadable (planning then ignores quota, and the queued Job shows Kueue's reason)."""
    local = api.get_local_queue(namespace, queue)
    name = ((local or {}).get("spec") or {}).get("clusterQueue")
    cluster = api.get_cluster_queue(str(name)) if name else None
    if not cluster:
        return None
    cohort = api.list_cluster_queues() if cohort_of(cluster) else []  # what it may borrow
    return parse_cluster_queue(cluster, cohort, {p.metadata.name: resource_name(p.spec.gpu) for p in pools})


def _workload(api: ChildReader, namespace: str, job: Manifest) -> Manifest | None:
    """The Kueue Workload of a queued Job that is still suspended (read only then: it is what the job's
    Queued condition shows; an admitted Job needs no read)."""
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    if not spec.get("suspend") or not (meta.get("labels") or {}).get(LABEL_QUEUE) or not meta.get("uid"):
        return None
    found = api.list_workloads(namespace, f"{LABEL_JOB_UID}={meta['uid']}")
    return found[0] if found else None


def _attempt_children(api: ChildReader, ref: JobRef, index: int, *, progress_due: bool = False) -> AttemptChildren:
    """The attempt's Job, plan and pods. The plan ConfigMap is written before the Job (crash-safe order)
    and the Job carries a copy of the plan, so while the Job exists and none of its pods waits to start on
    its node the ConfigMap is not read: a ConfigMap somebody deleted shows as a bound pod that cannot mount
    it (Pending), and that pass reads it and restores it. Most passes of a running job read one object fewer."""
    name = train_job_name(ref.name, index)
    job = api.get_job(ref.namespace, name)
    pods = api.list_job_pods(ref.namespace, pod_selector(ref.name, COMPONENT_TRAINER, index), job) if job else []
    annotated = _annotated_plan(job) if job is not None else None
    waiting = any(_waits_on_node(p) for p in pods)
    if annotated is not None and not waiting:
        plan, recorded = annotated, True
    else:
        cm = api.get_config_map(ref.namespace, plan_config_map_name(ref.name, index))
        parsed, _ = parse_plan_record((cm or {}).get("data"))
        plan, recorded = parsed or annotated, cm is not None
    return AttemptChildren(
        index=index,
        job=summarize_job(job, pods, name, _workload(api, ref.namespace, job)) if job is not None else None,
        plan=plan,
        plan_recorded=recorded,
        trainer=_trainer_sample(api, ref, index, pods) if progress_due else None,
    )


def _waits_on_node(pod: Manifest) -> bool:
    """Bound to a node and not started: what a missing ConfigMap volume looks like. A pod the scheduler
    has not placed yet waits for a node (a volume does not keep a pod from being scheduled), so in a
    queue of pending pods the plan ConfigMap is not read again on every pass."""
    return (pod.get("status") or {}).get("phase", "Pending") == "Pending" and bool((pod.get("spec") or {}).get("nodeName"))


def _trainer_sample(api: ChildReader, ref: JobRef, index: int, pods: list[Manifest]) -> TrainerSample | None:
    """Rank 0's metrics (the pod with completion index 0, running, with an IP); None when unreadable.

    The operator reads them over the pod network (the trainer needs no API access); a metrics endpoint
    of another job on the same address (the local test bed shares 127.0.0.1) is ignored by its labels."""
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        index_annotation = (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
        if index_annotation != "0" or status.get("phase") != "Running" or not status.get("podIP"):
            continue
        values = api.trainer_metrics(status["podIP"], contract.METRICS_PORT, job=ref.name)
        return trainer_sample(values, attempt=index, pod=str(meta.get("name", ""))) if values else None
    return None


def _annotated_plan(job: Manifest) -> Plan | None:
    raw = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN_JSON)
    plan, _ = parse_plan_record({PLAN_KEY: raw} if raw else None)
    return plan


def _recorded_plan(api: ChildReader, ref: JobRef, index: int) -> RecordedPlan | None:
    cm = api.get_config_map(ref.namespace, plan_config_map_name(ref.name, index))
    plan, summary = parse_plan_record((cm or {}).get("data"))
    return RecordedPlan(plan, summary) if plan is not None else None
