"""The profile step: reuse a cached profile, or run the profiling Job and read its Profile."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from memfit.api.common import PeftMethod
from memfit.api.hashing import profile_cache_key
from memfit.api.job import (
    MemoryOptimizedTrainingJobSpec,
    MemoryOptimizedTrainingJobStatus,
    Phase,
    ProfileSummary,
)
from memfit.api.peft_layers import resolve_targets
from memfit.api.pod import PROFILER_CONTAINER
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.catalog import GpuCatalog, GPUModel
from memfit.kube.common import DeviceRequest, Placement
from memfit.kube.names import LABEL_POOL, profile_cache_name, profile_job_name
from memfit.kube.profile_cache import CachedProfile, Observation, build_profile_cache
from memfit.kube.profile_job import build_profile_input, build_profile_job, profile_claim_template
from memfit.lifecycle import conditions as c
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.images import BLOCKER_REASONS, pod_blocker
from memfit.lifecycle.observed import JobSummary
from memfit.lifecycle.probe_points import (
    probe_config,
    probe_failure,
    probe_observations,
    probe_run,
    probe_words,
    probed,
    read_probe,
    script_key,
)
from memfit.lifecycle.profile_fit import (
    ANALYTIC,
    ANALYTIC_HEADROOM_PERCENT,
    FULL,
    REDUCED,
    ProfilingChoice,
    choose_profiling,
    fits,
)
from memfit.lifecycle.queueing import queue_step
from memfit.lifecycle.result import Delete, Ensure, WriteData
from memfit.lifecycle.snapshot import LaunchSettings, Snapshot
from memfit.lifecycle.spend import run_spend
from memfit.lifecycle.world import World
from memfit.memory.problems import ShapeError, shape_from_problem
from memfit.mig import devices_per_node, resource_name
from memfit.planner.offers import Offer, resolve_offer


def profile_key(
    spec: MemoryOptimizedTrainingJobSpec,
    status: MemoryOptimizedTrainingJobStatus,
    settings: LaunchSettings,
    world: World | None,
) -> str:
    """The job's profile cache key: `profile_cache_key` of the problem, the optimizer and 8-bit choice,
    the trainer image, the GPU product the profile is measured on and its depth (profile_fit.py).

    Once the job has a profile, the key recorded in its status is kept (re-plans, monitoring and
    learning after a pool changed use the same cache). Before, the product is the profiling pool's:
    the pool named in `profiling.nodePool`, else the cheapest allowed pool per GPU by price where the
    profiled model fits, from the pools' specs only, so that the key does not move with momentary
    free capacity. `world` may be None only when the status already records the key."""
    return profile_keys(spec, status, settings, world)[-1]


def profile_keys(
    spec: MemoryOptimizedTrainingJobSpec,
    status: MemoryOptimizedTrainingJobStatus,
    settings: LaunchSettings,
    world: World | None,
) -> tuple[str, ...]:
    """The cache keys to look for, in order; the last one is the job's own (`profile_key`). A job that
    would profile depth-reduced first looks for a full-depth profile of the same problem on the same
    GPU product, and reuses it when it exists."""
    if status.profile is not None and status.profile.problem_hash:
        return (status.profile.problem_hash,)
    assert world is not None, "the key of a job not yet profiled depends on the pools"
    choice = profiling_choice(spec, world)
    product = choice.pool.spec.gpu.product if choice.pool else _profiling_product(spec, world)

    def key(depth: str) -> str:
        return profile_cache_key(
            spec.problem,
            optimizer=str(spec.training.optimizer.value),
            optimizer8bit=str(spec.strategy.optimizer8bit.value),
            image=settings.pod(spec).image,
            gpu_product=product,
            depth=depth,
            peft=_peft_key(spec),
            script=script_key(spec),
        )

    return (key(FULL), key(choice.depth)) if choice.depth != FULL else (key(FULL),)


def profiling_choice(spec: MemoryOptimizedTrainingJobSpec, world: World) -> ProfilingChoice:
    """Depth and pool of the profile (profile_fit.py): the named pool, else the allowed pools by price."""
    if spec.profiling.node_pool != "auto":
        pool = world.pool(spec.profiling.node_pool)
        return choose_profiling(spec, [pool] if pool else [], world.catalog)
    return choose_profiling(spec, _by_price(_allowed(spec, world), world.catalog), world.catalog)


def _allowed(spec: MemoryOptimizedTrainingJobSpec, world: World) -> list[GPUNodePool]:
    """The pools the job may use: named in placement.nodePools (all when empty), and with a node selector
    the podTemplate's terms do not contradict."""
    template = spec.pod_template
    unusable = world.unusable_pools()
    return [p for p in world.pools
            if (not spec.placement.node_pools or p.metadata.name in spec.placement.node_pools)
            and p.metadata.name not in unusable
            and not (template and template.selector_conflicts(p.spec.node_selector))]


def _per_device(pool: GPUNodePool, catalog: GpuCatalog) -> float:
    """The pool's price per GPU (or MIG slice) and hour, as stated (0 when it leaves the price to the catalog)."""
    return (pool.spec.price_per_node_hour or 0.0) / devices_per_node(pool.spec.gpu, catalog.find(pool.spec.gpu.product))


def _by_price(pools: list[GPUNodePool], catalog: GpuCatalog) -> list[GPUNodePool]:
    return sorted(pools, key=lambda p: (_per_device(p, catalog), p.metadata.name))


def _profiling_product(spec: MemoryOptimizedTrainingJobSpec, world: World) -> str:
    if spec.profiling.node_pool != "auto":
        pool = world.pool(spec.profiling.node_pool)
        return pool.spec.gpu.product if pool else "unknown"
    allowed = _by_price(_allowed(spec, world), world.catalog)
    return allowed[0].spec.gpu.product if allowed else "any"


def profile_step(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, digest: str
) -> Profile | None:
    """The profile to plan with, or None while profiling (or after it failed).

    A cached profile is used when `profiling.reuse` allows it or once this job's own measurement is in
    the cache (condition Profiled). Otherwise the job waits for its own profiling Job to finish, even
    when an older profile of the problem is cached."""
    cached = snap.profile_cache
    if cached and cached.profile.compute == ANALYTIC:
        mark_analytic(draft, digest, cached.profile)
        return cached.profile
    if cached and draft.condition_is(c.PROFILED, True):
        return cached.profile
    if cached and spec.profiling.reuse:
        measured = draft.phase == Phase.PROFILING  # this job profiled it (before a restart)
        mark_profiled(draft, digest, cached.profile, measured=measured)
        return cached.profile

    world = snap.pools()
    choice = profiling_choice(spec, world)
    if choice.depth == ANALYTIC:
        return _store_analytic(draft, snap, spec, digest, choice.reason, cached)
    placement = profiling_placement(spec, world, choice)
    if placement is None:
        draft.fail(
            c.PROFILING_FAILED,
            f"profiling.nodePool {spec.profiling.node_pool!r} is not a GPUNodePool (pools: {world.names()})",
        )
        return None
    job = snap.profiling
    name = profile_job_name(snap.job.name)
    if job is None or not job.exists:
        owner = snap.job.owner()
        probe = probe_run(spec, _gpu(world, placement.pool))
        draft.effects.append(
            Ensure(build_profile_input(owner=owner, problem=spec.problem, problem_hash=digest, probe=probe))
        )
        if (claims := profile_claim_template(owner=owner, placement=placement)) is not None:
            draft.effects.append(Ensure(claims))  # a DRA pool's device claim, before the Job
        draft.effects.append(
            Ensure(
                build_profile_job(
                    owner=owner,
                    problem_hash=digest,
                    placement=placement,
                    pod=snap.settings.pod(spec),
                    timeout_seconds=spec.profiling.timeout_seconds,
                    optimizer=str(spec.training.optimizer.value),
                    optimizer8bit=str(spec.strategy.optimizer8bit.value),
                    depth=choice.depth,
                    queue=spec.scheduling.kueue_queue,
                    model=spec.problem.huggingface,
                    template=spec.pod_template,
                    probe=probe,
                    **_lora_check(spec),
                )
            )
        )
        _profiling(draft, placement.pool, name, choice)
        return None
    if job.deleting:
        return None  # a rescheduled profiling Job is still going away; the next reconcile recreates it
    pool = job.labels.get(LABEL_POOL, placement.pool)
    if queue_step(draft, job, "profiling Job"):
        if not _move_queued(draft, snap, spec, job, pool, choice):
            _profiling(draft, pool, name, choice)
        return None
    if not job.finished and _reschedule(draft, snap, spec, job, pool):
        return None
    blocker = pod_blocker(job, spec, namespace=snap.job.namespace, now=snap.now, what="profiling ")
    if blocker is not None:
        if blocker.gives_up:
            draft.fail(blocker.failure, blocker.failure_message())
            return None
        if draft.condition_reason(c.PROFILED) != blocker.waiting:
            draft.event(blocker.waiting, blocker.message, warning=True)
        draft.set(c.PROFILED, False, blocker.waiting, blocker.waiting_message())
        draft.enter(draft.phase, f"{blocker.waiting}: {blocker.waiting_message()}")
        return None
    if not job.finished:
        _profiling(draft, pool, name, choice)
        return None
    profile, error = profile_from(job)
    probe_points: tuple[Observation, ...] = ()
    note = ""
    if profile is not None and probed(spec) is not None:
        probe_points, error = _probe_points(snap, spec, job, pool)
        if error:
            profile = None
        else:
            note = probe_words(probe_points, probe_config(spec, _gpu(world, pool)))
    _record_spend(draft, snap, job, pool, "Profiled" if profile is not None else c.PROFILING_FAILED)
    if profile is None:
        draft.fail(c.PROFILING_FAILED, error)
        return None
    if profile.compute == ANALYTIC:  # the profiler could not reduce the model: it says why
        return _store_analytic(draft, snap, spec, digest, profile.compute_reason or "", cached, profile=profile,
                               extra=probe_points)
    fresh = CachedProfile(
        profile.model_copy(update={"problem_hash": digest[:16]}), _with(cached, probe_points)
    )
    draft.effects.append(
        WriteData(build_profile_cache(namespace=snap.job.namespace, problem_hash=digest, cached=fresh))
    )
    draft.profile_seconds = profile.seconds
    mark_profiled(draft, digest, fresh.profile, measured=True, note=note)
    return fresh.profile


def _gpu(world: World, pool_name: str) -> GPUModel | None:
    pool = world.pool(pool_name)
    return world.catalog.find(pool.spec.gpu.product) if pool is not None else None


def _with(cached: CachedProfile | None, extra: tuple[Observation, ...]) -> tuple[Observation, ...]:
    """The cache's observations and `extra` (the probe's), each job's once."""
    kept = tuple(o for o in (cached.observations if cached else ()) if o.job not in {e.job for e in extra})
    return (*kept, *extra)


def _probe_points(snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, job: JobSummary,
                  pool: str) -> tuple[tuple[Observation, ...], str]:  # fmt: skip
    """The probe's measured points as observations, or why the script cannot be planned from them."""
    reading, error = read_probe(job)
    if reading is None:
        return (), error
    if failure := probe_failure(reading):
        return (), failure
    world = snap.pools()
    gpu = _gpu(world, pool)
    config = probe_config(spec, gpu)
    memory = gpu.usable_mib * 2**20 if gpu is not None else 0
    product = gpu.product if gpu is not None else pool
    return probe_observations(reading, config, gpu_product=product, gpu_memory_bytes=memory,
                              job=snap.job.name), ""  # fmt: skip


def _record_spend(draft: Draft, snap: Snapshot, job: JobSummary, pool: str, outcome: str) -> None:
    """The finished profiling run's spend (once): one GPU of `pool` from the Job's start until now."""
    if draft.profiling_spend is not None or job.started_at is None:
        return
    found = snap.pools().pool(pool)
    offer = resolve_offer(found, catalog=snap.pools().catalog) if found is not None else None
    if not isinstance(offer, Offer):
        return
    draft.profiling_spend = run_spend(
        kind="profiling", attempt=None, node_pool=pool, outcome=outcome, gpus=1, started=job.started_at,
        finished=snap.now, price_per_hour=offer.price_per_node_hour / offer.gpus_per_node,
    )


def _profiling(draft: Draft, pool: str, name: str, choice: ProfilingChoice) -> None:
    """Profiling: entered once with an Event; a blocker that cleared (the Secret created, the image
    pulled) gives the condition and the MESSAGE column back to the profiling message."""
    unblocked = draft.condition_reason(c.PROFILED) in BLOCKER_REASONS
    if draft.phase != Phase.PROFILING or unblocked:
        depth = f", depth-reduced: {choice.reason}" if choice.depth == REDUCED and choice.reason else (
            ", depth-reduced" if choice.depth == REDUCED else "")
        msg = f"profiling on pool {pool} (Job {name}{depth})"
        if draft.phase != Phase.PROFILING:
            draft.event(c.PROFILING, msg)
        draft.enter(Phase.PROFILING, msg)
        draft.set(c.PROFILED, False, c.PROFILING, msg)


def _move_queued(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, job: JobSummary, pool: str,
    choice: ProfilingChoice,
) -> bool:
    """A profiling Job Kueue has not admitted for capacityTimeoutSeconds on a pool without free quota
    moves to the cheapest other allowed pool (where its depth fits) whose quota has a GPU free now: the
    Job is deleted and the next reconcile creates it there (profiling_placement ranks pools with free
    quota first). Only with `profiling.nodePool: auto`; otherwise, or when no other pool has quota, it
    keeps its place in the queue. True when it moved."""
    world = snap.pools()
    quota = world.queue_quota
    since = draft.true_since(c.QUEUED)
    if quota is None or since is None or spec.profiling.node_pool != "auto" or quota.free(pool) > 0:
        return False
    waited = int((snap.now - since).total_seconds())
    timeout = spec.recovery.capacity_timeout_seconds
    if waited < timeout:
        return False
    others = [p for p in _allowed(spec, world) if p.metadata.name != pool and quota.free(p.metadata.name) > 0
              and (choice.pool is None or fits(spec, p, choice.depth, world.catalog))]
    if not others:
        return False
    target = _by_price(others, world.catalog)[0].metadata.name
    msg = (f"LocalQueue {job.queue} has not admitted profiling Job {job.name} on {pool} for {waited}s "
           f"(capacityTimeoutSeconds {timeout}; {quota.describe()}); profiling on {target}, which has quota")
    draft.effects.append(Delete(job.name))
    draft.set(c.QUEUED, False, c.NO_QUOTA, msg)  # the new Job's wait starts afresh
    draft.set(c.PROFILED, False, c.PROFILING_RESCHEDULED, msg)
    draft.event(c.NO_QUOTA, msg, warning=True)
    return True


def _reschedule(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, job: JobSummary, pool: str
) -> bool:
    """A profiling pod that found no GPU (capacity changed since placement) is placed again, before
    the Job's deadline turns a capacity wait into a profiling failure; True when it decided that (or
    gave up)."""
    now = snap.now
    # A pod that waits for its claim (not bound, not seen yet) would wait as long on any other pool.
    stuck = [p.unschedulable_since for p in job.pods if p.unschedulable_since is not None and not p.waits_for_claim]
    limit = min(spec.recovery.capacity_timeout_seconds, spec.profiling.timeout_seconds // 2)
    if not stuck or (now - min(stuck)).total_seconds() < limit:
        return False
    since = draft.false_since(c.PROFILED) or now
    if (now - since).total_seconds() >= spec.profiling.timeout_seconds:
        # Placed again and again without ever getting a GPU: each new Job restarts its own
        # deadline, so the bound on the whole profiling phase is kept here.
        msg = (
            f"profiling pod found no GPU for {int((now - since).total_seconds())}s "
            f"(profiling.timeoutSeconds {spec.profiling.timeout_seconds}), last on pool {pool}: "
            f"{job.pods[-1].unschedulable_message[:300] if job.pods else ''}"
        )
        draft.fail(c.PROFILING_FAILED, msg)
        return True
    draft.effects.append(Delete(job.name))
    msg = f"profiling pod unschedulable on pool {pool} for {limit}s or more; placing it again"
    draft.set(c.PROFILED, False, c.PROFILING_RESCHEDULED, msg)
    draft.event(c.PROFILING_RESCHEDULED, msg, warning=True)
    return True


def _store_analytic(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, digest: str, reason: str,
    cached: CachedProfile | None, *, profile: Profile | None = None, extra: tuple[Observation, ...] = (),
) -> Profile | None:
    """Nothing can be measured: plan from the analytic shape (stored like a profile, so that measured
    peaks of the attempts are learned as for any other job)."""
    if profile is None or profile.shape is None:
        try:
            shape = shape_from_problem(spec.problem)
        except ShapeError as exc:
            draft.fail(c.PROFILING_FAILED, f"{reason}; and no analytic model either: {exc}")
            return None
        profile = Profile(problem_hash=digest[:16], shape=shape, compute=ANALYTIC, compute_reason=reason[:256])
    profile = profile.model_copy(update={"problem_hash": digest[:16]})
    fresh = CachedProfile(profile, _with(cached, extra))
    draft.effects.append(
        WriteData(build_profile_cache(namespace=snap.job.namespace, problem_hash=digest, cached=fresh))
    )
    mark_analytic(draft, digest, profile)
    return profile


def mark_analytic(draft: Draft, digest: str, profile: Profile) -> None:
    """Profiled=False, reason AnalyticOnly: the plan rests on the analytic model with more headroom."""
    draft.profile = ProfileSummary(
        problem_hash=digest[:16], source=ANALYTIC, config_map=profile_cache_name(digest),
        parameters=profile.shape.parameters if profile.shape else None,
    )
    msg = (f"not profiled: {profile.compute_reason or 'nothing could be measured'}; planned from the analytic "
           f"memory model with {ANALYTIC_HEADROOM_PERCENT} percentage points more headroom")
    if not draft.condition_is(c.PROFILED, False) or draft.condition_reason(c.PROFILED) != c.ANALYTIC_ONLY:
        draft.event(c.ANALYTIC_ONLY, msg, warning=True)
    draft.set(c.PROFILED, False, c.ANALYTIC_ONLY, msg)


def mark_profiled(draft: Draft, digest: str, profile: Profile, *, measured: bool, note: str = "") -> None:
    source = "measured" if measured else "cached"
    draft.profile = ProfileSummary(
        problem_hash=digest[:16],
        source=source,
        config_map=profile_cache_name(digest),
        parameters=profile.shape.parameters if profile.shape else None,
    )
    reason = c.PROFILE_MEASURED if measured else c.PROFILE_CACHED
    msg = f"profile {digest[:16]} ({source}) from ConfigMap {profile_cache_name(digest)}"
    if profile.depth is not None:
        blocks = " and ".join(str(r.blocks) for r in profile.depth.reduced)
        msg += f"; depth-reduced: {blocks} of {profile.depth.layers} blocks measured, scaled to {profile.depth.layers}"
    if profile.skipped:
        msg += "; " + skipped_words(profile)
    if note:
        msg += "; " + note
    draft.set(c.PROFILED, True, reason, msg)
    draft.event(reason, msg)


def skipped_words(profile: Profile) -> str:
    """What the profiling device refused, for the Profiled condition: `cpu could not run bf16/none, bf16/full
    (TypeError: ...): skipped, planned from the analytic terms`."""
    pairs = ", ".join(sorted({f"{s.precision.value}/{s.checkpointing.value}" for s in profile.skipped}))
    where = ("never planned on this GPU" if profile.device.startswith("cuda:")
             else "planned from the analytic terms")
    return f"{profile.device} could not run {pairs} ({profile.skipped[0].reason}): skipped, {where}"


def profile_from(summary: JobSummary) -> tuple[Profile | None, str]:
    """The Profile from the profiler pod's termination message, or why there is none."""
    for pod in reversed(summary.pods):
        # A probed job's profiler is an init container (memfit.kube.probe_pod); its message is the Profile.
        raw = pod.init_message(PROFILER_CONTAINER)
        raw = pod.raw_message if raw is None else raw
        if not raw:
            continue
        try:
            profile = Profile.model_validate_json(raw)
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
        crashed = next((p.exit_detail() for p in reversed(summary.pods) if p.exit_code is not None), "")
        detail = "; ".join(filter(None, [detail, crashed])) or "no termination message"
        return None, f"profiling Job {summary.name} failed: {detail}"
    return None, f"profiling Job {summary.name} finished without a Profile in its termination message"


def profiling_placement(
    spec: MemoryOptimizedTrainingJobSpec, world: World, choice: ProfilingChoice | None = None
) -> Placement | None:
    """The pool the profiling pod runs on: the one named, else the cheapest allowed pool per GPU with a
    free GPU now, among those where the chosen depth fits (any node when no pool is allowed); for a
    queued job, pools whose ClusterQueue quota has a GPU free come first. None when the named pool
    does not exist."""
    if spec.profiling.node_pool != "auto":
        pool = world.pool(spec.profiling.node_pool)
        return placement_of(pool) if pool else None
    allowed = _allowed(spec, world)
    if choice is not None and choice.pool is not None:
        allowed = [p for p in allowed if fits(spec, p, choice.depth, world.catalog)] or [choice.pool]
    if not allowed:
        return Placement(pool="any", node_selector={})

    quota = world.queue_quota

    def rank(p: GPUNodePool) -> tuple[int, int, float, str]:
        free = world.capacity.get(p.metadata.name)
        no_quota = 1 if quota is not None and quota.free(p.metadata.name) == 0 else 0  # Kueue could not admit it
        return (no_quota, 0 if free and free.free_gpus > 0 else 1, _per_device(p, world.catalog), p.metadata.name)

    return placement_of(min(allowed, key=rank))


def device_request(pool: GPUNodePool) -> DeviceRequest | None:
    """A DRA pool's request (its DeviceClass, driver and MIG profile); None for a device-plugin pool."""
    gpu = pool.spec.gpu
    if gpu.dra is None:
        return None
    return DeviceRequest(gpu.dra.device_class_name, gpu.dra.driver, gpu.mig.profile if gpu.mig else None)


def placement_of(pool: GPUNodePool) -> Placement:
    return Placement(
        pool=pool.metadata.name,
        node_selector=dict(pool.spec.node_selector),
        tolerations=tuple(pool.spec.tolerations),
        gpu_resource=resource_name(pool.spec.gpu),
        dra=device_request(pool),
    )


def _lora_check(spec: MemoryOptimizedTrainingJobSpec) -> dict[str, Any]:
    """When the job allows LoRA/QLoRA: the targets and rank the profiler checks against the model, and
    the adapters whose variant it measures."""
    peft = spec.strategy.peft
    methods = tuple(m.value for m in peft.methods() if m in (PeftMethod.LORA, PeftMethod.QLORA))
    if not methods:
        return {}
    targets = resolve_targets(spec.problem.to_wire(), list(peft.lora.target_modules))
    if not targets:
        return {}
    return {"lora_targets": tuple(targets), "lora_rank": peft.lora.rank, "lora_dropout": peft.lora.dropout,
            "peft_methods": methods, "qlora_quant": peft.qlora.quant_type.value,
            "qlora_double_quant": peft.qlora.double_quant}


def _peft_key(spec: MemoryOptimizedTrainingJobSpec) -> str:
    """The adapter settings the profile's PEFT variant is measured with ("" when none is)."""
    check = _lora_check(spec)
    return json.dumps(check, sort_keys=True, separators=(",", ":")) if check else ""
