"""The launch step: plan an attempt (or take the recorded plan) and build its children."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, suppress

from memfit.api import pod as contract
from memfit.api.job import Attempt, AttemptOutcome, MemoryOptimizedTrainingJobSpec, Phase, PlanSummary
from memfit.api.plan import Plan
from memfit.api.profile import Profile
from memfit.kube.checkpoints import (
    CheckpointStorage,
    VolumeKind,
    build_checkpoint_claim,
    checkpoint_volume,
    shared_across_nodes,
)
from memfit.kube.common import Owner, PodSettings
from memfit.kube.names import (
    ANNOTATION_INJECT_HOLD_STEP,
    ANNOTATION_INJECT_KILL_RANK,
    ANNOTATION_INJECT_KILL_STEP,
    ANNOTATION_INJECT_OOM_ATTEMPTS,
    ANNOTATION_INJECT_OOM_STEP,
    ANNOTATION_INJECT_PEAK_ATTEMPTS,
    ANNOTATION_INJECT_PEAK_FACTOR,
    train_job_name,
)
from memfit.kube.train_job import (
    build_plan_config_map,
    build_service,
    build_training_job,
    plan_json,
    training_claim_template,
)
from memfit.lifecycle import conditions as c
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.planning import PlanOutcome, plan_job
from memfit.lifecycle.profiling import placement_of
from memfit.lifecycle.result import Effect, Ensure
from memfit.lifecycle.snapshot import Snapshot
from memfit.lifecycle.world import World

ANNOTATION_PLAN_JSON = "memfit.dev/plan-json"
Timer = Callable[[], AbstractContextManager[object]]


def launch_step(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, profile: Profile, *, timer: Timer
) -> None:
    """Plan attempt `len(attempts)` and launch it; wait when it only lacks free GPUs; NoFit otherwise.

    A plan ConfigMap that already exists for this attempt is the record of a decision taken before a
    crash (or before the status was lost): that decision holds, and the planner does not run."""
    world = snap.pools()
    index = len(draft.attempts)
    planned_spec = checkpoint_step(draft, snap, spec)
    if planned_spec is None:
        return  # the named claim is missing: no children until it exists (the resync looks again)
    recorded = snap.recorded_plan
    plan: Plan
    summary: PlanSummary | None
    if recorded is not None:
        plan, summary = recorded.plan, recorded.summary
    else:
        excluded = frozenset(a.node_pool for a in draft.attempts if a.outcome == AttemptOutcome.NO_CAPACITY)
        observations = snap.profile_cache.observations if snap.profile_cache else ()

        def plan_attempt(ignore_capacity: bool = False) -> PlanOutcome:
            with timer():
                return plan_job(
                    spec=planned_spec,
                    profile=profile,
                    pools=world.pools,
                    capacity=world.capacity,
                    excluded_pools=excluded,
                    observations=observations,
                    attempt=index,
                    job_name=snap.job.name,
                    catalog=world.catalog,
                    ignore_capacity=ignore_capacity,
                    quota=world.queue_quota,
                    unusable=world.unusable_pools(),
                )

        outcome = plan_attempt()
        if outcome.plan is None:
            _no_plan(draft, outcome, plan_attempt(ignore_capacity=True))
            return
        plan, summary = outcome.plan, outcome.summary
    pool = world.pool(plan.node_pool)
    if pool is None:
        draft.fail(c.NO_FIT, f"planned pool {plan.node_pool} no longer exists")
        return
    owner = snap.job.owner()
    summary = summary or plan.summary()  # only the Plan survived: it carries its baselines
    draft.effects.extend(
        launch_effects(
            owner=owner,
            spec=spec,
            plan=plan,
            summary=summary,
            world=world,
            pod=snap.settings.pod(spec),
            storage=snap.settings.checkpoints,
        )
    )
    draft.plan = summary
    draft.checkpoint_claim = checkpoint_volume(spec, snap.job.name).claim
    draft.attempts.append(
        Attempt(
            index=index,
            node_pool=plan.node_pool,
            nodes=plan.nodes,
            started_at=snap.now,
            outcome=AttemptOutcome.LAUNCHING,
            predicted_peak_bytes=plan.memory.peak_bytes,
            reason=plan.describe(),
            gpus=plan.world_size,
            price_per_hour=plan.price_per_hour,
        )
    )
    savings = f", {summary.savings} vs {summary.baseline}" if summary.savings and summary.baseline else ""
    if savings and summary.wall_clock_ratio is not None:
        savings += f" ({summary.wall_clock_ratio:.2f}x the wall-clock)"
    msg = (
        f"attempt {index}: {plan.describe()} on {plan.node_pool}, "
        f"predicted peak {summary.predicted_peak}, {summary.cost_per_hour_text}/h{savings}"
    )
    if index > 0:
        msg += f"; {global_batch_words(plan, spec.training.global_batch_size)}"
    if summary.cost_note:
        msg += f"; {summary.cost_note}"
    draft.set(c.PLANNED, True, c.PLAN_FOUND, msg)
    draft.set(c.RUNNING, False, c.LAUNCHING, f"training Job {train_job_name(snap.job.name, index)} created")
    draft.enter(Phase.LAUNCHING if index == 0 else Phase.REPLANNING, msg)
    draft.event(c.PLAN_FOUND if index == 0 else c.REPLANNING, msg)


def checkpoint_step(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec
) -> MemoryOptimizedTrainingJobSpec | None:
    """Check the checkpoint volume before a launch and say in CheckpointStorage which it is.

    Returns the spec to plan with: a volume only one node can mount (ReadWriteOnce) keeps the plan on
    one node, since a multi-node resume reads every rank's shards from one folder. None when the named
    claim does not exist: nothing is created until it does."""
    volume = checkpoint_volume(spec, snap.job.name)
    if volume.kind == VolumeKind.EMPTY_DIR:
        draft.set(c.CHECKPOINT_STORAGE, False, c.EPHEMERAL_CHECKPOINTS,
                  "checkpoints in an emptyDir (training.checkpoint.emptyDir): a re-plan or a replaced pod "
                  "starts again at step 0")  # fmt: skip
        return spec
    observed = snap.checkpoint_claim
    if volume.kind == VolumeKind.CLAIM:
        if observed is None or not observed.exists:
            msg = (f"training.checkpoint.volumeClaim: PersistentVolumeClaim {snap.job.namespace}/{volume.claim} "
                   "does not exist; create it (ReadWriteMany for plans over several nodes) or leave "
                   "volumeClaim empty for a claim memfit creates")  # fmt: skip
            if draft.condition_reason(c.CHECKPOINT_STORAGE) != c.CHECKPOINT_CLAIM_MISSING:
                draft.event(c.CHECKPOINT_CLAIM_MISSING, msg, warning=True)
            draft.set(c.CHECKPOINT_STORAGE, False, c.CHECKPOINT_CLAIM_MISSING, msg)
            draft.enter(Phase.PLANNING, msg)
            return None
        modes, whose = observed.access_modes, f"your claim {volume.claim}"
    else:
        modes = observed.access_modes if observed is not None and observed.exists else (
            snap.settings.checkpoints.access_mode,)
        whose = f"claim {volume.claim} (memfit's, deleted with the job)"
    if shared_across_nodes(modes):
        draft.set(c.CHECKPOINT_STORAGE, True, c.SHARED_VOLUME,
                  f"checkpoints on {whose}, ReadWriteMany: every node of the plan writes and resumes from "
                  "one folder")  # fmt: skip
        return spec
    single = spec.placement.max_nodes <= 1
    draft.set(c.CHECKPOINT_STORAGE, True, c.SINGLE_NODE_VOLUME,
              f"checkpoints on {whose}, {'/'.join(modes) or 'no access modes'}: "
              + ("one node mounts it" if single else
                 "one node mounts it, so the plan stays on one node (placement.maxNodes is "
                 f"{spec.placement.max_nodes}); for multi-node plans use a ReadWriteMany storage class "
                 "(chart value checkpoints.accessMode) or claim"))  # fmt: skip
    if single:
        return spec
    return spec.model_copy(update={"placement": spec.placement.model_copy(update={"max_nodes": 1})})


def global_batch_words(plan: Plan, global_batch: int) -> str:
    """What a re-plan did to the global batch: kept (the planner only splits it differently), spelled
    out as GPUs x micro-batch x accumulation; a mismatch is said as loudly."""
    effective = plan.global_batch(plan.world_size)
    verb = "keeps" if effective == global_batch else f"CHANGES (training.globalBatchSize is {global_batch})"
    return (f"{verb} the effective global batch {effective} = {plan.world_size} GPUs x micro-batch "
            f"{plan.micro_batch_size} x accumulation {plan.gradient_accumulation_steps}")


def _no_plan(draft: Draft, outcome: PlanOutcome, someday: PlanOutcome) -> None:
    if someday.plan is not None:
        # It fits once GPUs free up: wait like a queue (the resync loop retries), do not fail.
        msg = (
            f"waiting for capacity: {someday.plan.describe()} on {someday.plan.node_pool} fits "
            f"but its GPUs are in use; {outcome.message()}"
        )
        if not draft.condition_is(c.PLANNED, False) or draft.phase != Phase.PLANNING:
            draft.event(c.WAITING_FOR_CAPACITY, msg)
        draft.set(c.PLANNED, False, c.WAITING_FOR_CAPACITY, msg)
        draft.enter(Phase.PLANNING, msg)
        return
    # The condition reason (and the phase message's `NoFit: ` prefix, from `fail`) says NoFit once.
    reasons = outcome.result.no_fit_message()
    draft.fail(c.NO_FIT, reasons)
    draft.set(c.PLANNED, False, c.NO_FIT, reasons)


def launch_effects(
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    plan: Plan,
    summary: PlanSummary | None,
    world: World,
    pod: PodSettings,
    storage: CheckpointStorage,
) -> list[Effect]:
    """The children of an attempt, in crash-safe order: the plan record first, the training Job last."""
    pool = world.pool(plan.node_pool)
    if pool is None:
        return []
    effects: list[Effect] = [
        Ensure(build_plan_config_map(owner=owner, plan=plan, summary=summary), record=True),
        Ensure(build_service(owner=owner)),
    ]
    if checkpoint_volume(spec, owner.name).kind == VolumeKind.CREATED:
        # Before the Job: its pods never wait on a claim nobody creates; owned, so deleted with the job.
        effects.append(Ensure(build_checkpoint_claim(owner=owner, plan=plan, storage=storage)))
    placement = placement_of(pool)
    if (claims := training_claim_template(owner=owner, plan=plan, placement=placement)) is not None:
        effects.append(Ensure(claims))  # a DRA pool's: before the Job, so its pods find their template
    job = build_training_job(
        owner=owner,
        spec=spec,
        plan=plan,
        placement=placement,
        pod=pod,
        suspend=bool(spec.scheduling.kueue_queue),
        extra_env=fault_injection(owner.annotations, plan.attempt),
    )
    # The Plan travels with its Job too: a plan ConfigMap deleted under a running attempt is rebuilt.
    job["metadata"]["annotations"][ANNOTATION_PLAN_JSON] = plan_json(plan)
    effects.append(Ensure(job))
    return effects


def fault_injection(annotations: dict[str, str], attempt: int) -> dict[str, str]:
    """Env for the trainer's fault injection (a simulated OOM, an inflated measured peak, a killed or stalled rank),
    from the job's annotations (tests, chaos drills)."""
    env: dict[str, str] = {}
    step = annotations.get(ANNOTATION_INJECT_OOM_STEP, "")
    if step.isdigit() and attempt < _attempts(annotations, ANNOTATION_INJECT_OOM_ATTEMPTS):
        env[contract.ENV_INJECT_OOM_AT_STEP] = step
    hold = annotations.get(ANNOTATION_INJECT_HOLD_STEP, "")
    if hold.isdigit() and attempt == 0:
        env[contract.ENV_INJECT_HOLD_AT_STEP] = hold
    kill = annotations.get(ANNOTATION_INJECT_KILL_STEP, "")
    if kill.isdigit() and attempt == 0:
        env[contract.ENV_INJECT_KILL_AT_STEP] = kill
        rank = annotations.get(ANNOTATION_INJECT_KILL_RANK, "")
        if rank.isdigit():
            env[contract.ENV_INJECT_KILL_RANK] = rank
    factor = annotations.get(ANNOTATION_INJECT_PEAK_FACTOR, "")
    if factor and attempt < _attempts(annotations, ANNOTATION_INJECT_PEAK_ATTEMPTS):
        with suppress(ValueError):
            env[contract.ENV_INJECT_PEAK_FACTOR] = str(float(factor))
    return env


def _attempts(annotations: dict[str, str], key: str) -> int:
    try:
        return int(annotations.get(key, "1"))
    except ValueError:
        return 1
