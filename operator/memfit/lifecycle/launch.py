"""The launch step: plan an attempt (or take the recorded plan) and build its children."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, suppress

from memfit.api.job import Attempt, AttemptOutcome, MemoryOptimizedTrainingJobSpec, Phase, PlanSummary
from memfit.api.plan import Plan
from memfit.api.profile import Profile
from memfit.kube.common import Owner, PodSettings
from memfit.kube.names import (
    ANNOTATION_INJECT_OOM_ATTEMPTS,
    ANNOTATION_INJECT_OOM_STEP,
    ANNOTATION_INJECT_PEAK_ATTEMPTS,
    ANNOTATION_INJECT_PEAK_FACTOR,
    train_job_name,
)
from memfit.kube.train_job import (
    build_plan_config_map,
    build_pod_group,
    build_service,
    build_training_job,
    plan_json,
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
                    spec=spec,
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
            pod_group=spec.scheduling.pod_group and snap.settings.pod_group_enabled,
        )
    )
    draft.plan = summary
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


def global_batch_words(plan: Plan, global_batch: int) -> str:
    """What a re-plan did to the global batch: kept (the planner only splits it differently), spelled
    out as GPUs x micro-batch x accumulation; a mismatch is said as loudly."""
    effective = plan.world_size * plan.micro_batch_size * plan.gradient_accumulation_steps
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
    draft.fail(c.NO_FIT, outcome.message())
    draft.set(c.PLANNED, False, c.NO_FIT, outcome.message())


def launch_effects(
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    plan: Plan,
    summary: PlanSummary | None,
    world: World,
    pod: PodSettings,
    pod_group: bool,
) -> list[Effect]:
    """The children of an attempt, in crash-safe order: the plan record first, the training Job last."""
    pool = world.pool(plan.node_pool)
    if pool is None:
        return []
    effects: list[Effect] = [
        Ensure(build_plan_config_map(owner=owner, plan=plan, summary=summary), record=True),
        Ensure(build_service(owner=owner)),
    ]
    if pod_group:
        effects.append(Ensure(build_pod_group(owner=owner, plan=plan)))
    job = build_training_job(
        owner=owner,
        spec=spec,
        plan=plan,
        placement=placement_of(pool),
        pod=pod,
        suspend=bool(spec.scheduling.kueue_queue),
        extra_env=fault_injection(owner.annotations, plan.attempt),
    )
    # The Plan travels with its Job too: a plan ConfigMap deleted under a running attempt is rebuilt.
    job["metadata"]["annotations"][ANNOTATION_PLAN_JSON] = plan_json(plan)
    effects.append(Ensure(job))
    return effects


def fault_injection(annotations: dict[str, str], attempt: int) -> dict[str, str]:
    """Env for the trainer's fault injection (a simulated OOM, an inflated measured peak), from the
    job's annotations (tests, chaos drills)."""
    env: dict[str, str] = {}
    step = annotations.get(ANNOTATION_INJECT_OOM_STEP, "")
    if step.isdigit() and attempt < _attempts(annotations, ANNOTATION_INJECT_OOM_ATTEMPTS):
        env["MEMFIT_INJECT_OOM_AT_STEP"] = step
    factor = annotations.get(ANNOTATION_INJECT_PEAK_FACTOR, "")
    if factor and attempt < _attempts(annotations, ANNOTATION_INJECT_PEAK_ATTEMPTS):
        with suppress(ValueError):
            env["MEMFIT_INJECT_PEAK_FACTOR"] = str(float(factor))
    return env


def _attempts(annotations: dict[str, str], key: str) -> int:
    try:
        return int(annotations.get(key, "1"))
    except ValueError:
        return 1
