"""The one level-triggered reconcile of a MemoryOptimizedTrainingJob.

create, resume, update, timers and child events all call `reconcile_job`, which reads the job and
its children, decides the next step from spec + status + the world, ensures children with
deterministic names (409 with our owner = already done), and patches status only when it changed.
Running it twice in a row writes nothing the second time.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from memfit import metrics
from memfit.api.hashing import problem_hash
from memfit.api.job import MemoryOptimizedTrainingJobSpec, Phase
from memfit.api.plan import Plan
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.api.validation import violations_from
from memfit.controller import conditions as c
from memfit.controller.kubeapi import KubeApi
from memfit.controller.observe import (
    REASON_CUDA_OOM,
    REASON_INVALID_PLAN,
    JobSummary,
    parse_time,
    pod_selector,
    summarize_job,
)
from memfit.controller.planning import PlanOutcome, config_key, plan_job, plan_status
from memfit.controller.settings import OperatorSettings
from memfit.controller.world import World, observe_world
from memfit.kube.child_fields import child_field_problems
from memfit.kube.common import Owner, Placement, PodSettings
from memfit.kube.names import (
    ANNOTATION_INJECT_OOM_ATTEMPTS,
    ANNOTATION_INJECT_OOM_STEP,
    COMPONENT_PROFILER,
    COMPONENT_TRAINER,
    LABEL_POOL,
    MAX_JOB_NAME,
    plan_config_map_name,
    profile_cache_name,
    profile_job_name,
    train_job_name,
)
from memfit.kube.profile_cache import CachedProfile, Observation, build_profile_cache, parse_profile_cache
from memfit.kube.profile_job import build_profile_input, build_profile_job
from memfit.kube.train_job import build_plan_config_map, build_pod_group, build_service, build_training_job

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
ANNOTATION_PLAN_JSON = "memfit.dev/plan-json"
OUTCOME_LAUNCHING = "Launching"
OUTCOME_RUNNING = "Running"
OUTCOME_SUCCEEDED = "Succeeded"
OUTCOME_OOM = "OutOfMemory"
OUTCOME_NO_CAPACITY = "NoCapacity"
OUTCOME_FAILED = "Failed"
ACTIVE_OUTCOMES = (OUTCOME_LAUNCHING, OUTCOME_RUNNING)
REPLAN_OUTCOMES = (OUTCOME_OOM, OUTCOME_NO_CAPACITY)


@dataclass
class Decision:
    """What one reconcile decided: the new status and the events that explain it."""

    status: Manifest
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    resource_version: str = ""  # of the MOTJ after the status patch (its watch event is our own write)

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(("Warning" if warning else "Normal", reason, message))


def reconcile_job(
    api: KubeApi,
    body: Manifest,
    *,
    settings: OperatorSettings,
    world: World | None = None,
    world_source: Callable[[], World] | None = None,
    post_event: Callable[[Manifest], None] | None = None,
    now: datetime | None = None,
) -> Decision | None:
    """Reconcile one MOTJ; returns the decision it persisted, or None when nothing changed.

    The pools and their capacity come from `world`, else from `world_source` (the operator's shared
    snapshot), else from the API server; only the steps that plan or place pods ask for them.
    Events go to `post_event` (the operator's background poster), else straight to the API server."""
    now = now or datetime.now(UTC)
    meta = body["metadata"]
    old_status: Manifest = copy.deepcopy(body.get("status") or {})
    decision = Decision(status=copy.deepcopy(old_status))
    generation = meta.get("generation")
    status = decision.status
    if not status.get("conditions"):
        status["conditions"] = c.initial_conditions(generation, now)
    status.setdefault("phase", Phase.PENDING.value)
    status.setdefault("attempts", [])

    spec, problems = _parse_spec(body)
    if spec is None or problems:
        _fail(decision, reason=c.INVALID_SPEC, message="; ".join(problems), generation=generation, now=now)
    elif status["phase"] in (Phase.SUCCEEDED.value, Phase.FAILED.value):
        pass  # terminal: nothing more to do (children are kept for inspection; GC removes them)
    else:
        owner = Owner(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            annotations=dict(meta.get("annotations") or {}),
        )
        _advance(
            api,
            decision,
            owner=owner,
            spec=spec,
            generation=generation,
            settings=settings,
            world_of=_on_demand(api, world, world_source),
            now=now,
        )
    status["observedGeneration"] = generation
    if status == old_status:
        return None
    patched = api.patch_motj_status(meta["namespace"], meta["name"], status, meta["resourceVersion"])
    decision.resource_version = str((patched.get("metadata") or {}).get("resourceVersion", ""))
    for type_, reason, message in decision.events:
        _post_event(api, body, type_=type_, reason=reason, message=message, now=now, post=post_event)
    return decision


# --- steps -----------------------------------------------------------------------------------------
def _advance(
    api: KubeApi,
    decision: Decision,
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    generation: int | None,
    settings: OperatorSettings,
    world_of: Callable[..., World],
    now: datetime,
) -> None:
    status = decision.status
    digest = problem_hash(spec.problem)
    pod = PodSettings(
        image=spec.image or settings.trainer_image,
        image_pull_policy=settings.image_pull_policy,
        extra_labels=settings.extra_pod_labels,
        service_account=settings.trainer_service_account,
    )
    attempts: list[Manifest] = status["attempts"]
    current = attempts[-1] if attempts else None
    if current is not None and current.get("outcome") in ACTIVE_OUTCOMES:
        # Monitoring needs neither the profile nor the pools (only a relaunch does): no reads for them.
        _monitor_step(
            api,
            decision,
            owner=owner,
            spec=spec,
            attempt=current,
            digest=digest,
            world_of=world_of,
            pod=pod,
            settings=settings,
            generation=generation,
            now=now,
        )
        return

    cached = _read_cache(api, owner.namespace, digest)
    profile = _profile_step(
        api,
        decision,
        owner=owner,
        spec=spec,
        digest=digest,
        cached=cached,
        world_of=world_of,
        pod=pod,
        generation=generation,
        now=now,
    )
    if profile is None:
        return
    observations = cached.observations if cached else ()
    if current is None or current.get("outcome") in REPLAN_OUTCOMES:
        if current is not None:
            # The attempt's outcome is in the stored status (this reconcile read it), so its Job can go
            # now: deleting it before the outcome was stored would let a crash in between relaunch it.
            api.delete_job(owner.namespace, train_job_name(owner.name, int(current["index"])))
        replans_used = max(0, len(attempts) - 1) + (1 if current else 0)
        if current is not None and replans_used > spec.recovery.max_replans:
            _fail(
                decision,
                reason=c.REPLANS_EXHAUSTED,
                message=f"{len(attempts)} attempts, last: {current.get('reason', '')}; "
                f"recovery.maxReplans is {spec.recovery.max_replans}",
                generation=generation,
                now=now,
            )
            return
        _launch_step(
            api,
            decision,
            owner=owner,
            spec=spec,
            profile=profile,
            world=world_of(),
            pod=pod,
            observations=observations,
            settings=settings,
            generation=generation,
            now=now,
        )


def _on_demand(api: KubeApi, world: World | None, source: Callable[[], World] | None) -> Callable[..., World]:
    """The world, obtained at most once per reconcile and only when a step asks for it; `fresh=True`
    reads it from the API server (before failing a job over a pool the shared snapshot lacks)."""
    box: list[World] = [world] if world is not None else []

    def get(fresh: bool = False) -> World:
        if fresh and source is not None and world is None:
            box[:] = [observe_world(api)]
        if not box:
            box.append(source() if source is not None else observe_world(api))
        return box[0]

    return get


def _read_cache(api: KubeApi, namespace: str, digest: str) -> CachedProfile | None:
    raw = api.get_config_map(namespace, profile_cache_name(digest))
    return parse_profile_cache((raw or {}).get("data"))


def _profile_step(
    api: KubeApi,
    decision: Decision,
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    digest: str,
    cached: CachedProfile | None,
    world_of: Callable[..., World],
    pod: PodSettings,
    generation: int | None,
    now: datetime,
) -> Profile | None:
    """The profile to plan with, or None while profiling (or after it failed).

    A cached profile is used when `profiling.reuse` allows it or once this job's own measurement is in
    the cache (condition Profiled). Otherwise the job waits for its own profiling Job to finish, even
    when an older profile of the problem is cached."""
    status = decision.status
    profiled = _condition_is(status, c.PROFILED, "True")
    if cached and profiled:
        return cached.profile
    if cached and spec.profiling.reuse:
        measured = status.get("phase") == Phase.PROFILING.value  # this job profiled it (before a restart)
        _mark_profiled(decision, digest, cached.profile, measured=measured, generation=generation, now=now)
        return cached.profile

    world = world_of()
    placement = _profiling_placement(spec, world)
    if placement is None:  # the snapshot may predate a pool created a moment ago
        world = world_of(fresh=True)
        placement = _profiling_placement(spec, world)
    if placement is None:
        _fail(
            decision,
            reason=c.PROFILING_FAILED,
            message=f"profiling.nodePool {spec.profiling.node_pool!r} is not a GPUNodePool "
            f"(pools: {', '.join(p.metadata.name for p in world.pools) or 'none'})",
            generation=generation,
            now=now,
        )
        return None
    api.ensure(build_profile_input(owner=owner, problem=spec.problem, problem_hash=digest))
    job, created = api.ensure(
        build_profile_job(
            owner=owner,
            problem_hash=digest,
            placement=placement,
            pod=pod,
            timeout_seconds=spec.profiling.timeout_seconds,
        )
    )
    pods = api.list_pods(owner.namespace, pod_selector(owner.name, COMPONENT_PROFILER))
    summary = summarize_job(job, pods, profile_job_name(owner.name))
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return None  # a rescheduled profiling Job is still going away; the next reconcile recreates it
    pool = str(((job.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL, placement.pool))
    stuck = [p.unschedulable_since for p in summary.pods if p.unschedulable_since is not None]
    limit = min(spec.recovery.capacity_timeout_seconds, spec.profiling.timeout_seconds // 2)
    if not summary.finished and stuck and (now - min(stuck)).total_seconds() >= limit:
        since = _false_since(status, c.PROFILED) or now
        if (now - since).total_seconds() >= spec.profiling.timeout_seconds:
            # Placed again and again without ever getting a GPU: each new Job restarts its own
            # deadline, so the bound on the whole profiling phase is kept here.
            msg = (
                f"profiling pod found no GPU for {int((now - since).total_seconds())}s "
                f"(profiling.timeoutSeconds {spec.profiling.timeout_seconds}), last on pool {pool}: "
                f"{summary.pods[-1].unschedulable_message[:300] if summary.pods else ''}"
            )
            _fail(decision, reason=c.PROFILING_FAILED, message=msg, generation=generation, now=now)
            return None
        # The profiling pod found no GPU (capacity changed since placement): start over on the pool
        # that has one now, before the Job's deadline turns a capacity wait into a profiling failure.
        api.delete_job(owner.namespace, summary.name)
        msg = f"profiling pod unschedulable on pool {pool} for {limit}s or more; placing it again"
        _set(decision, c.PROFILED, False, c.PROFILING_RESCHEDULED, msg, generation, now)
        decision.event(c.PROFILING_RESCHEDULED, msg, warning=True)
        return None
    if created or not summary.finished:
        if status["phase"] != Phase.PROFILING.value:
            msg = f"profiling on pool {pool} (Job {summary.name})"
            _phase(decision, Phase.PROFILING, msg)
            _set(decision, c.PROFILED, False, c.PROFILING, msg, generation, now)
            decision.event(c.PROFILING, msg)
        return None
    profile, error = _profile_from(summary)
    if profile is None:
        _fail(decision, reason=c.PROFILING_FAILED, message=error, generation=generation, now=now)
        return None
    fresh = CachedProfile(
        profile.model_copy(update={"problem_hash": digest[:16]}), cached.observations if cached else ()
    )
    manifest = build_profile_cache(namespace=owner.namespace, problem_hash=digest, cached=fresh)
    _, created_cache = api.ensure(manifest)
    if not created_cache:
        api.replace_config_map_data(owner.namespace, manifest["metadata"]["name"], manifest["data"])
    metrics.PROFILE_SECONDS.observe(profile.seconds)  # the profiler's own wall time, once per result read
    _mark_profiled(decision, digest, fresh.profile, measured=True, generation=generation, now=now)
    return fresh.profile


def _mark_profiled(
    decision: Decision,
    digest: str,
    profile: Profile,
    *,
    measured: bool,
    generation: int | None,
    now: datetime,
) -> None:
    source = "measured" if measured else "cached"
    summary = {
        "problemHash": digest[:16],
        "source": source,
        "configMap": profile_cache_name(digest),
        "parameters": profile.shape.parameters if profile.shape else None,
    }
    decision.status["profile"] = {k: v for k, v in summary.items() if v is not None}
    reason = c.PROFILE_MEASURED if measured else c.PROFILE_CACHED
    msg = f"profile {digest[:16]} ({source}) from ConfigMap {profile_cache_name(digest)}"
    _set(decision, c.PROFILED, True, reason, msg, generation, now)
    decision.event(reason, msg)


def _profile_from(summary: JobSummary) -> tuple[Profile | None, str]:
    """The Profile from the profiler pod's termination message, or why there is none."""
    for pod in reversed(summary.pods):
        if not pod.raw_message:
            continue
        try:
            profile = Profile.model_validate_json(pod.raw_message)
        except ValidationError as error:
            if pod.phase == "Failed" or (pod.exit_code or 0) != 0:  # a crash, not a profiler's answer
                failed = f"; Job {summary.failure_reason}" if summary.failure_reason else ""
                return None, (
                    f"profiling pod {pod.name} failed (exit code {pod.exit_code}): "
                    f"{pod.raw_message[:512]}{failed}"
                )
            return None, f"pod {pod.name}: termination message is not a Profile: {error.errors()[0]['msg']}"
        if profile.error:
            return None, f"profiler: {profile.error}"
        if summary.complete:
            return profile, ""
    if summary.failed:
        detail = summary.failure_message or summary.failure_reason
        return None, f"profiling Job {summary.name} failed: {detail or 'no termination message'}"
    return None, f"profiling Job {summary.name} finished without a Profile in its termination message"


def _profiling_placement(spec: MemoryOptimizedTrainingJobSpec, world: World) -> Placement | None:
    pools = {p.metadata.name: p for p in world.pools}
    if spec.profiling.node_pool != "auto":
        pool = pools.get(spec.profiling.node_pool)
        return _placement(pool) if pool else None
    allowed = [
        p
        for p in world.pools
        if not spec.placement.node_pools or p.metadata.name in spec.placement.node_pools
    ]
    if not allowed:
        return Placement(pool="any", node_selector={})

    def rank(p: GPUNodePool) -> tuple[int, float, str]:
        free = world.capacity.get(p.metadata.name)
        price = p.spec.price_per_node_hour or 0.0
        return (0 if free and free.free_gpus > 0 else 1, price / p.spec.gpu.per_node, p.metadata.name)

    return _placement(min(allowed, key=rank))


def _placement(pool: GPUNodePool) -> Placement:
    return Placement(
        pool=pool.metadata.name,
        node_selector=dict(pool.spec.node_selector),
        tolerations=tuple(pool.spec.tolerations),
    )


def _launch_step(
    api: KubeApi,
    decision: Decision,
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    profile: Profile,
    world: World,
    pod: PodSettings,
    observations: tuple[Observation, ...],
    settings: OperatorSettings,
    generation: int | None,
    now: datetime,
) -> None:
    status = decision.status
    attempts: list[Manifest] = status["attempts"]
    index = len(attempts)
    excluded = {str(a.get("nodePool")) for a in attempts if a.get("outcome") == OUTCOME_NO_CAPACITY}
    # Plan first and create the plan ConfigMap (one write, no read, in the common case); a ConfigMap
    # that already exists is the record of a decision taken before a crash, and that decision holds.
    plan_attempt = functools.partial(
        plan_job, spec=spec, profile=profile, pools=world.pools, capacity=world.capacity,
        excluded_pools=frozenset(excluded), observations=observations, attempt=index, job_name=owner.name,
    )
    fresh = plan_attempt()
    outcome: PlanOutcome | None = fresh
    plan = fresh.plan
    if plan is None:
        recorded = api.get_config_map(owner.namespace, plan_config_map_name(owner.name, index))
        if recorded is not None:
            plan, outcome = Plan.model_validate_json(recorded["data"]["plan.json"]), None
    if plan is None and outcome is not None:
        someday = plan_attempt(ignore_capacity=True)
        if someday.plan is not None:
            # It fits once GPUs free up: wait like a queue (the resync loop retries), do not fail.
            msg = (
                f"waiting for capacity: {someday.plan.describe()} on {someday.plan.node_pool} fits "
                f"but its GPUs are in use; {outcome.message()}"
            )
            if not _condition_is(status, c.PLANNED, "False") or status.get("phase") != Phase.PLANNING.value:
                decision.event(c.WAITING_FOR_CAPACITY, msg)
            _set(decision, c.PLANNED, False, c.WAITING_FOR_CAPACITY, msg, generation, now)
            _phase(decision, Phase.PLANNING, msg)
            return
        _fail(decision, reason=c.NO_FIT, message=outcome.message(), generation=generation, now=now)
        _set(decision, c.PLANNED, False, c.NO_FIT, outcome.message(), generation, now)
        return
    assert plan is not None
    cm = build_plan_config_map(owner=owner, plan=plan)
    stored, created = api.ensure(cm)
    if not created and stored.get("data", {}).get("plan.json") != cm["data"]["plan.json"]:
        plan, outcome = Plan.model_validate_json(stored["data"]["plan.json"]), None
        cm = build_plan_config_map(owner=owner, plan=plan)
    pools = {p.metadata.name: p for p in world.pools}
    pool = pools.get(plan.node_pool)
    if pool is None:
        _fail(
            decision,
            reason=c.NO_FIT,
            message=f"planned pool {plan.node_pool} no longer exists",
            generation=generation,
            now=now,
        )
        return
    placement = _placement(pool)
    api.ensure(build_service(owner=owner))
    gang = spec.scheduling.pod_group and settings.pod_group_enabled
    if gang:
        api.ensure(build_pod_group(owner=owner, plan=plan))
    job = build_training_job(
        owner=owner,
        spec=spec,
        plan=plan,
        placement=placement,
        pod=pod,
        suspend=bool(spec.scheduling.kueue_queue),
        extra_env=_fault_injection(owner.annotations, plan.attempt),
    )
    job["metadata"]["annotations"][ANNOTATION_PLAN_JSON] = cm["data"]["plan.json"]
    api.ensure(job)

    summary = outcome.summary if outcome else plan_status(plan, spec=spec, pools=world.pools)
    status["plan"] = summary
    attempts.append(
        {
            "index": index,
            "nodePool": plan.node_pool,
            "nodes": plan.nodes,
            "startedAt": c.now_iso(now),
            "outcome": OUTCOME_LAUNCHING,
            "predictedPeakBytes": plan.memory.peak_bytes,
            "reason": plan.describe(),
        }
    )
    savings = f", {summary['savings']} vs baseline" if summary.get("savings") else ""
    msg = (
        f"attempt {index}: {plan.describe()} on {plan.node_pool}, "
        f"predicted peak {summary['predictedPeak']}, {summary['costPerHourText']}/h{savings}"
    )
    _set(decision, c.PLANNED, True, c.PLAN_FOUND, msg, generation, now)
    _set(
        decision,
        c.RUNNING,
        False,
        c.LAUNCHING,
        f"training Job {train_job_name(owner.name, index)} created",
        generation,
        now,
    )
    _phase(decision, Phase.LAUNCHING if index == 0 else Phase.REPLANNING, msg)
    decision.event(c.PLAN_FOUND if index == 0 else c.REPLANNING, msg)


def _monitor_step(
    api: KubeApi,
    decision: Decision,
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    attempt: Manifest,
    digest: str,
    world_of: Callable[..., World],
    pod: PodSettings,
    settings: OperatorSettings,
    generation: int | None,
    now: datetime,
) -> None:
    index = int(attempt["index"])
    name = train_job_name(owner.name, index)
    job = api.get_job(owner.namespace, name)
    plan_cm = api.get_config_map(owner.namespace, f"{owner.name}-plan-{index}")
    plan = _plan_of(plan_cm, job)
    if job is None or plan is None:
        # A child was deleted under us: rebuild it from the recorded plan (or re-plan if it is gone too).
        if plan is None:
            _finish_attempt(attempt, OUTCOME_NO_CAPACITY, now, reason="plan record lost; re-planning")
            return
        _relaunch(api, owner=owner, spec=spec, plan=plan, world=world_of(), pod=pod, settings=settings)
        return
    if plan_cm is None:
        api.ensure(build_plan_config_map(owner=owner, plan=plan))
    pods = api.list_pods(owner.namespace, pod_selector(owner.name, COMPONENT_TRAINER, index))
    summary = summarize_job(job, pods, name)
    peaks = [p.peak_bytes for p in summary.pods if p.peak_bytes is not None]
    measured = max(peaks) if peaks else None

    if summary.complete:
        _finish_attempt(attempt, OUTCOME_SUCCEEDED, now, measured=measured, reason="training completed")
        decision.status["measuredPeakBytes"] = measured
        predicted = plan.memory.peak_bytes
        meters = {str(p.message.get("memoryMeter", "")) for p in summary.pods} - {""}
        gpu_truth = bool(meters) and all(m.startswith("cuda") for m in meters)
        if measured is not None and gpu_truth:
            # Only GPU measurements calibrate GPU predictions (auto-downsizing); a CPU stand-in's
            # tensor bytes leave out the CUDA context and allocator, so they are reported, not learned.
            _learn(api, owner=owner, digest=digest, plan=plan, measured=measured, oom=False)
            error = f", prediction error {100 * (predicted - measured) / measured:+.1f}%"
            versus = f"measured peak {_gib(measured)} vs predicted {_gib(predicted)}{error}"
        elif measured is not None:
            versus = (
                f"measured peak {_mib(measured)} on {', '.join(sorted(meters)) or 'an unknown meter'} "
                f"(CPU stand-in, not compared with the GPU prediction {_gib(predicted)})"
            )
        else:
            versus = f"no measured peak reported; predicted {_gib(predicted)}"
        msg = f"training succeeded on {plan.node_pool}: {versus}"
        _set(decision, c.RUNNING, False, c.TRAINING_SUCCEEDED, msg, generation, now)
        _set(decision, c.SUCCEEDED, True, c.TRAINING_SUCCEEDED, msg, generation, now)
        _set(decision, c.FAILED, False, c.TRAINING_SUCCEEDED, "", generation, now)
        _phase(decision, Phase.SUCCEEDED, msg)
        decision.event(c.TRAINING_SUCCEEDED, msg)
        return

    oom = next((p for p in summary.pods if p.out_of_memory), None)
    invalid = next((p for p in summary.pods if p.message.get("reason") == REASON_INVALID_PLAN), None)
    if summary.failed or oom is not None or invalid is not None:
        if invalid is not None:
            _finish_attempt(attempt, OUTCOME_FAILED, now, measured=measured, reason=c.INVALID_PLAN)
            _fail(
                decision,
                reason=c.INVALID_PLAN,
                message=str(invalid.message.get("message", invalid.raw_message)),
                generation=generation,
                now=now,
            )
            return
        if oom is not None:
            kind = oom.out_of_memory or REASON_CUDA_OOM
            peak = oom.peak_bytes or measured
            step = oom.message.get("step")
            reason = f"{kind} at step {step} on {plan.node_pool} (peak {_gib(peak) if peak else 'n/a'})"
            _finish_attempt(attempt, OUTCOME_OOM, now, measured=peak, reason=reason)
            _learn(api, owner=owner, digest=digest, plan=plan, measured=peak or 0, oom=True)
            _set(decision, c.RUNNING, False, c.OUT_OF_MEMORY, reason, generation, now)
            _phase(decision, Phase.REPLANNING, f"attempt {index}: {reason}; re-planning")
            decision.event(c.OUT_OF_MEMORY, reason, warning=True)
            return
        detail = summary.failure_message or summary.failure_reason or "pods failed"
        last = next((p for p in reversed(summary.pods) if p.phase == "Failed"), None)
        if last and last.raw_message:
            detail += f"; {last.raw_message[:512]}"
        _finish_attempt(attempt, OUTCOME_FAILED, now, measured=measured, reason=detail[:1024])
        _fail(
            decision,
            reason=c.TRAINING_FAILED,
            message=f"training Job {name} failed: {detail}",
            generation=generation,
            now=now,
        )
        return

    if summary.suspended:
        # Created suspended for Kueue: admission (unsuspend) is Kueue's decision, not a capacity failure.
        queue = spec.scheduling.kueue_queue
        _set(
            decision,
            c.RUNNING,
            False,
            c.WAITING_FOR_ADMISSION,
            f"training Job {name} is suspended until Kueue admits it (LocalQueue {queue})",
            generation,
            now,
        )
        return

    stuck = [p for p in summary.pods if p.unschedulable_since is not None]
    if stuck:
        since = min(p.unschedulable_since for p in stuck if p.unschedulable_since)
        waited = (now - since).total_seconds()
        if waited >= spec.recovery.capacity_timeout_seconds:
            reason = (
                f"pool {plan.node_pool} had no capacity for {int(waited)}s "
                f"(capacityTimeoutSeconds {spec.recovery.capacity_timeout_seconds}): "
                f"{stuck[0].unschedulable_message[:300]}"
            )
            _finish_attempt(attempt, OUTCOME_NO_CAPACITY, now, reason=reason)
            _set(decision, c.RUNNING, False, c.NO_CAPACITY, reason, generation, now)
            _phase(decision, Phase.REPLANNING, f"attempt {index}: {reason}; re-planning without it")
            decision.event(c.NO_CAPACITY, reason, warning=True)
            return
        _set(
            decision,
            c.RUNNING,
            False,
            c.PODS_PENDING,
            f"{len(stuck)} pod(s) unschedulable for {int(waited)}s on {plan.node_pool}",
            generation,
            now,
        )
        return

    if attempt.get("outcome") == OUTCOME_LAUNCHING and _never_had_pods(job, summary):
        # Counted from the Job controller's first sync (status.startTime): before it, the control
        # plane has not looked at the Job yet (e.g. kube-controller-manager re-listing after an API
        # server restart) and nothing has refused the pods.
        started = parse_time((job.get("status") or {}).get("startTime"))
        waited = (now - started).total_seconds() if started else 0.0
        if started is not None and waited >= spec.recovery.capacity_timeout_seconds:
            # Nothing will change by itself: without this the job would stay Launching forever.
            detail = (
                f"the Job controller created no pod of training Job {name} in {int(waited)}s "
                f"(capacityTimeoutSeconds {spec.recovery.capacity_timeout_seconds}): a missing "
                f"PriorityClass, a ResourceQuota or an admission policy refuses them; see "
                f"`kubectl describe job {name}`"
            )
            _finish_attempt(attempt, OUTCOME_FAILED, now, reason=detail)
            _fail(decision, reason=c.PODS_NOT_CREATED, message=detail, generation=generation, now=now)
            return

    running = [p for p in summary.pods if p.running]
    if len(running) >= plan.nodes and attempt.get("outcome") != OUTCOME_RUNNING:
        attempt["outcome"] = OUTCOME_RUNNING
        msg = f"{len(running)} training pod(s) running on {plan.node_pool}: {plan.describe()}"
        _set(decision, c.RUNNING, True, c.PODS_RUNNING, msg, generation, now)
        _phase(decision, Phase.RUNNING, msg)
        decision.event(c.PODS_RUNNING, msg)


def _never_had_pods(job: Manifest, summary: JobSummary) -> bool:
    """No pod now and none ever counted: not active, failed, succeeded, ready, terminating or
    uncounted (a pod deleted with its node counts as failed; one replaced after a pre-emption is
    only briefly absent, and its attempt was seen Running)."""
    counts = job.get("status") or {}
    keys = ("active", "failed", "succeeded", "ready", "terminating")
    uncounted = any((counts.get("uncountedTerminatedPods") or {}).values())
    return not summary.pods and not uncounted and not any(counts.get(k) for k in keys)


def _relaunch(
    api: KubeApi,
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    plan: Plan,
    world: World,
    pod: PodSettings,
    settings: OperatorSettings,
) -> None:
    pool = next((p for p in world.pools if p.metadata.name == plan.node_pool), None)
    if pool is None:
        return
    cm = build_plan_config_map(owner=owner, plan=plan)
    api.ensure(cm)
    api.ensure(build_service(owner=owner))
    job = build_training_job(
        owner=owner,
        spec=spec,
        plan=plan,
        placement=_placement(pool),
        pod=pod,
        suspend=bool(spec.scheduling.kueue_queue),
        extra_env=_fault_injection(owner.annotations, plan.attempt),
    )
    job["metadata"]["annotations"][ANNOTATION_PLAN_JSON] = cm["data"]["plan.json"]
    api.ensure(job)


def _fault_injection(annotations: dict[str, str], attempt: int) -> dict[str, str]:
    """Env for the trainer's OOM fault injection, from the job's annotations (tests, chaos drills)."""
    step = annotations.get(ANNOTATION_INJECT_OOM_STEP, "")
    try:
        attempts = int(annotations.get(ANNOTATION_INJECT_OOM_ATTEMPTS, "1"))
    except ValueError:
        attempts = 1
    if step.isdigit() and attempt < attempts:
        return {"MEMFIT_INJECT_OOM_AT_STEP": step}
    return {}


def _plan_of(cm: Manifest | None, job: Manifest | None) -> Plan | None:
    """The attempt's Plan from its ConfigMap, else from the copy annotated on its training Job."""
    raw = (cm or {}).get("data", {}).get("plan.json")
    if raw is None and job is not None:
        raw = (job["metadata"].get("annotations") or {}).get(ANNOTATION_PLAN_JSON)
    if raw is None:
        return None
    try:
        return Plan.model_validate_json(raw)
    except ValidationError:
        return None


def _learn(
    api: KubeApi,
    *,
    owner: Owner,
    digest: str,
    plan: Plan,
    measured: int,
    oom: bool,
) -> None:
    """Store the attempt's measured peak with the profile (auto-downsizing and OOM escalation)."""
    cached = _read_cache(api, owner.namespace, digest)
    if cached is None:
        return
    observation = Observation(
        config_key=config_key(plan),
        gpu_product=plan.gpu_product,
        predicted_peak_bytes=plan.memory.peak_bytes,
        measured_peak_bytes=measured,
        gpu_memory_bytes=plan.gpu_memory_bytes,
        out_of_memory=oom,
        job=f"{owner.name}/{plan.attempt}",
    )
    if any(o.job == observation.job for o in cached.observations):
        return
    updated = CachedProfile(cached.profile, (*cached.observations, observation))
    manifest = build_profile_cache(namespace=owner.namespace, problem_hash=digest, cached=updated)
    api.replace_config_map_data(owner.namespace, manifest["metadata"]["name"], manifest["data"])


# --- status helpers --------------------------------------------------------------------------------
def _parse_spec(body: Manifest) -> tuple[MemoryOptimizedTrainingJobSpec | None, list[str]]:
    problems: list[str] = []
    name = body["metadata"]["name"]
    if len(name) > MAX_JOB_NAME:
        problems.append(f"metadata.name: at most {MAX_JOB_NAME} characters so that child names stay valid")
    try:
        spec = MemoryOptimizedTrainingJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        return None, problems + [str(v).removeprefix("spec: ") for v in violations_from(error, "spec")]
    return spec, problems + child_field_problems(spec)


def _false_since(status: Manifest, type_: str) -> datetime | None:
    """When the condition last became False (None unless it is False now)."""
    for cond in status.get("conditions", []):
        if cond.get("type") == type_ and cond.get("status") == "False":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _condition_is(status: Manifest, type_: str, value: str) -> bool:
    return any(x.get("type") == type_ and x.get("status") == value for x in status.get("conditions", []))


def _set(
    decision: Decision,
    type_: str,
    value: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> None:
    decision.status["conditions"] = c.set_condition(
        decision.status["conditions"],
        type_=type_,
        status=value,
        reason=reason,
        message=message,
        generation=generation,
        now=now,
    )


def _phase(decision: Decision, phase: Phase, message: str) -> None:
    decision.status["phase"] = phase.value
    decision.status["message"] = message[:4096]


def _fail(decision: Decision, *, reason: str, message: str, generation: int | None, now: datetime) -> None:
    if decision.status.get("phase") == Phase.FAILED.value and _condition_is(
        decision.status, c.FAILED, "True"
    ):
        return
    _set(decision, c.FAILED, True, reason, message, generation, now)
    _set(decision, c.SUCCEEDED, False, reason, message, generation, now)
    _set(decision, c.RUNNING, False, reason, message, generation, now)
    _phase(decision, Phase.FAILED, f"{reason}: {message}")
    decision.event(reason, message, warning=True)


def _finish_attempt(
    attempt: Manifest, outcome: str, now: datetime, *, measured: int | None = None, reason: str = ""
) -> None:
    attempt["outcome"] = outcome
    attempt["finishedAt"] = c.now_iso(now)
    if measured is not None:
        attempt["measuredPeakBytes"] = measured
    attempt["reason"] = reason[:1024]


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f}Mi"


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f}Gi"


def _post_event(
    api: KubeApi,
    body: Manifest,
    *,
    type_: str,
    reason: str,
    message: str,
    now: datetime,
    post: Callable[[Manifest], None] | None = None,
) -> None:
    meta = body["metadata"]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body.get("apiVersion", "memfit.dev/v1alpha1"),
            "kind": body.get("kind", "MemoryOptimizedTrainingJob"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "memfit-operator"},
        "firstTimestamp": c.now_iso(now),
        "lastTimestamp": c.now_iso(now),
        "count": 1,
    }
    try:
        (post or api.create_event)(event)
    except Exception as error:  # events are best effort; never fail a reconcile over one
        log.warning("could not post event %s for %s/%s: %s", reason, meta["namespace"], meta["name"], error)
