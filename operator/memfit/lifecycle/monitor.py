"""The monitor step: follow the active attempt's training Job to Running, success, OOM re-plan,
capacity fallback or failure."""

from __future__ import annotations

from datetime import UTC

from memfit.api.job import AttemptOutcome, MemoryOptimizedTrainingJobSpec, Phase
from memfit.api.plan import Plan
from memfit.api.termination import (
    KEY_BUDGET_BYTES,
    KEY_MEMORY_METER,
    KEY_MESSAGE,
    KEY_STEP,
    TerminationReason,
)
from memfit.kube.names import train_job_name
from memfit.kube.train_job import build_plan_config_map
from memfit.lifecycle import conditions as c
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.images import Blocker, pod_blocker
from memfit.lifecycle.launch import launch_effects
from memfit.lifecycle.learning import ALLOCATOR_METERS, learn
from memfit.lifecycle.observed import JobSummary, PodSummary
from memfit.lifecycle.progress import final_progress, pod_changes, progress_of, still_starting
from memfit.lifecycle.queued import move_if_another_pool_has_quota
from memfit.lifecycle.queueing import queue_step
from memfit.lifecycle.result import Ensure
from memfit.lifecycle.snapshot import Snapshot, SnapshotIncomplete, TrainerSample


def monitor_step(draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, digest: str) -> None:
    children = snap.attempt
    if children is None:
        raise SnapshotIncomplete("monitoring needs the attempt's children, and the snapshot was read without them")
    index = children.index
    name = train_job_name(snap.job.name, index)
    plan = children.plan
    if plan is None:
        # Both the plan ConfigMap and the Job (with its copy of the plan) are gone: re-plan.
        draft.finish_attempt(AttemptOutcome.NO_CAPACITY, reason="plan record lost; re-planning")
        return
    job = children.job
    if job is None:
        # The training Job was deleted under us: rebuild it from the recorded plan.
        draft.effects.extend(
            launch_effects(
                owner=snap.job.owner(),
                spec=spec,
                plan=plan,
                summary=draft.plan,
                world=snap.pools(),
                pod=snap.settings.pod(spec),
                storage=snap.settings.checkpoints,
            )
        )
        return
    _restore_summary(draft, plan)
    if not children.plan_recorded:
        draft.effects.append(
            Ensure(build_plan_config_map(owner=snap.job.owner(), plan=plan, summary=draft.plan))
        )
    queue_step(draft, job, "training Job")
    peaks = [p.peak_bytes for p in job.pods if p.peak_bytes is not None]
    measured = max(peaks) if peaks else None
    if job.complete:
        _succeeded(draft, snap, plan, job, measured, digest)
    elif job.failed or any(p.out_of_memory or p.invalid_plan or p.over_plan for p in job.pods):
        _failed(draft, snap, plan, job, measured, digest)
    elif (blocker := pod_blocker(job, spec, namespace=snap.job.namespace, now=snap.now)) is not None:
        _blocked(draft, blocker)
    elif job.suspended:
        # Created suspended for Kueue: admission (unsuspend) is Kueue's decision, not a capacity failure;
        # after capacityTimeoutSeconds the job moves to another pool only if that one's quota fits it now.
        if not move_if_another_pool_has_quota(draft, snap, spec, plan, job):
            checked = draft.current is not None and draft.current.quota_checked_at is not None
            said = c.find(draft.conditions, c.RUNNING)
            if checked and said is not None and said.reason == c.WAITING_FOR_ADMISSION:
                # Between two looks at the quota (QUOTA_RECHECK_SECONDS), the last look's words stand.
                draft.enter(draft.phase, f"{c.WAITING_FOR_ADMISSION}: {said.message}")
            else:
                _block(draft, c.WAITING_FOR_ADMISSION, f"training Job {name} is suspended until Kueue admits it "
                                                       f"(LocalQueue {spec.scheduling.kueue_queue})")
    elif any(p.unschedulable_since is not None for p in job.pods):
        _unschedulable(draft, snap, spec, plan, job)
    elif not _pods_not_created(draft, snap, spec, job):
        _unblock(draft)
        running = [p for p in job.pods if p.running]
        current = draft.current
        if children.trainer is not None and children.trainer.attempt == index:
            _read_progress(draft, snap, spec, plan, children.trainer)
        if len(running) >= plan.nodes and len(job.pods) == len(running):
            draft.recheck_after = snap.settings.progress_seconds  # steady: the Job's events say the rest
        if len(running) >= plan.nodes and current is not None and (
            current.outcome != AttemptOutcome.RUNNING or not draft.condition_is(c.RUNNING, True)
        ):
            # Also after a replaced pod that was blocked for a while runs again: Running=True comes back.
            msg = f"{len(running)} training pod(s) running on {plan.node_pool}: {plan.describe()}"
            if current.outcome != AttemptOutcome.RUNNING:
                draft.update_current(outcome=AttemptOutcome.RUNNING)
                draft.event(c.PODS_RUNNING, msg)
            draft.set(c.RUNNING, True, c.PODS_RUNNING, msg)
            draft.enter(Phase.RUNNING, msg)


def _read_progress(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, plan: Plan, sample: TrainerSample
) -> None:
    """status.progress from rank 0's sample: never back to 0 while a replacement pod starts; an Event
    for a replaced pod and for a resume (from which step)."""
    previous = draft.progress
    if still_starting(sample, previous):
        return
    for reason, message, warning in pod_changes(sample, previous):
        draft.event(reason, message, warning=warning)
    draft.progress = progress_of(sample, max_steps=spec.training.max_steps, data_parallel=plan.world_size, now=snap.now)


BLOCKING = (
    c.IMAGE_PULL_FAILING, c.CONTAINER_CONFIG_ERROR, c.PODS_PENDING, c.WAITING_FOR_ADMISSION, c.WAITING_FOR_VOLUME
)


def _block(draft: Draft, reason: str, message: str) -> None:
    """Something keeps the pods from running: the Running condition and the MESSAGE column say what."""
    draft.set(c.RUNNING, False, reason, message)
    draft.enter(draft.phase, f"{reason}: {message}")


def _unblock(draft: Draft) -> None:
    """Nothing blocks any more: the MESSAGE column shows the plan again (the Planned condition's message)
    until the pods run."""
    planned = c.find(draft.conditions, c.PLANNED)
    if draft.condition_reason(c.RUNNING) in BLOCKING and planned is not None and planned.message:
        draft.set(c.RUNNING, False, c.LAUNCHING, "the training pods are starting")
        draft.enter(draft.phase, planned.message)


def _restore_summary(draft: Draft, plan: Plan) -> None:
    """The status summary is rebuilt from the stored Plan when the status lost it (or part of it): the
    Plan carries its costs and baselines, so what `kubectl get motj` shows survives restarts intact.
    A Plan recorded before it carried baselines only fills a missing summary."""
    summary = plan.summary()
    if draft.plan != summary and (draft.plan is None or plan.baseline is not None):
        draft.plan = summary


def _succeeded(
    draft: Draft, snap: Snapshot, plan: Plan, job: JobSummary, measured: int | None, digest: str
) -> None:
    draft.finish_attempt(AttemptOutcome.SUCCEEDED, measured=measured, reason="training completed")
    done = next((p.message for p in job.pods if p.message.get("reason") == "Completed"), {})
    if draft.progress is not None or done:
        # Shown finished with the final loss and the run's rate, also when it ended before any read.
        max_steps = plan.training.max_steps if plan.training is not None else _spec_max_steps(snap, draft)
        attempt = snap.attempt.index if snap.attempt is not None else plan.attempt
        draft.progress = final_progress(draft.progress, done, max_steps=max_steps, attempt=attempt, now=snap.now)
    draft.measured_peak_bytes = measured
    predicted = plan.memory.peak_bytes
    meters = {str(p.message.get(KEY_MEMORY_METER, "")) for p in job.pods} - {""}
    gpu_truth = bool(meters) and all(m.startswith("cuda") for m in meters)
    allocator = bool(meters) and all(m in ALLOCATOR_METERS for m in meters)
    if measured is not None and allocator:
        # Allocator tensor bytes teach the tensor terms from any device (a CPU stand-in included);
        # a GPU's reservation its own allocator gap (planner.measured).
        learn(draft, snap, plan, digest, measured=measured, oom=False, job=job)
    if measured is not None and gpu_truth:
        error = f", prediction error {100 * (predicted - measured) / measured:+.1f}%"
        versus = f"measured peak {gib(measured)} vs predicted {gib(predicted)}{error}"
    elif measured is not None:
        learned = "learned for the tensor terms" if allocator else "not learned"
        versus = (
            f"measured peak {mib(measured)} on {', '.join(sorted(meters)) or 'an unknown meter'} "
            f"(CPU stand-in, not compared with the GPU prediction {gib(predicted)}; {learned})"
        )
    else:
        versus = f"no measured peak reported; predicted {gib(predicted)}"
    msg = f"training succeeded on {plan.node_pool}: {versus}"
    draft.set(c.RUNNING, False, c.TRAINING_SUCCEEDED, msg)
    draft.set(c.SUCCEEDED, True, c.TRAINING_SUCCEEDED, msg)
    draft.set(c.FAILED, False, c.TRAINING_SUCCEEDED, "")
    draft.enter(Phase.SUCCEEDED, msg)
    draft.event(c.TRAINING_SUCCEEDED, msg)


def _failed(
    draft: Draft, snap: Snapshot, plan: Plan, job: JobSummary, measured: int | None, digest: str
) -> None:
    invalid = next((p for p in job.pods if p.invalid_plan), None)
    if invalid is not None:
        draft.finish_attempt(AttemptOutcome.FAILED, measured=measured, reason=c.INVALID_PLAN)
        draft.fail(c.INVALID_PLAN, str(invalid.message.get(KEY_MESSAGE, invalid.raw_message)))
        return
    over = next((p for p in job.pods if p.over_plan), None)
    if over is not None:
        _over_plan(draft, snap, plan, job, over.peak_bytes or measured or 0, over.message, digest)
        return
    oom = next((p for p in job.pods if p.out_of_memory), None)
    if oom is not None:
        kind = oom.out_of_memory or TerminationReason.CUDA_OUT_OF_MEMORY
        peak = oom.peak_bytes or measured
        reason = f"{kind} at step {oom.message.get(KEY_STEP)} on {plan.node_pool} (peak {gib(peak)})"
        draft.finish_attempt(AttemptOutcome.OUT_OF_MEMORY, measured=peak, reason=reason)
        learn(draft, snap, plan, digest, measured=peak or 0, oom=True, job=job)
        draft.set(c.RUNNING, False, c.OUT_OF_MEMORY, reason)
        draft.enter(Phase.REPLANNING, f"attempt {plan.attempt}: {reason}; re-planning")
        draft.event(c.OUT_OF_MEMORY, reason, warning=True)
        return
    detail = job.failure_message or job.failure_reason or "pods failed"
    last = next((p for p in reversed(job.pods) if p.phase == "Failed"), None)
    if last and last.exit_code is not None:
        detail += f"; {last.exit_detail()}"
    if plan.nodes > 1:
        _rank_failed(draft, plan, job, measured, detail)
        return
    draft.finish_attempt(AttemptOutcome.FAILED, measured=measured, reason=detail[:1024])
    draft.fail(c.TRAINING_FAILED, f"training Job {job.name} failed: {detail}")


def _rank_failed(draft: Draft, plan: Plan, job: JobSummary, measured: int | None, detail: str) -> None:
    """A rank of a multi-node plan failed (not for memory, not an invalid plan) or was disrupted: the Job's
    failure policy ended every pod of the attempt together. A failure restarts all ranks from the last
    checkpoint (decide.py counts these against recovery.maxRestarts); a disruption (the node drained,
    lost or pre-empted) re-plans onto the capacity left, possibly fewer nodes, and every rank resumes from
    the last checkpoint (a re-plan: recovery.maxReplans)."""
    if _disrupted(job):
        reason = f"a rank of the {plan.nodes}-node gang was disrupted (node drained, lost or pre-empted): {detail}"
        outcome, why, then = AttemptOutcome.RANK_DISRUPTED, c.RANK_DISRUPTED, "re-planning onto the capacity left"
    else:
        reason = f"a rank of the {plan.nodes}-node gang failed: {detail}"
        outcome, why, then = AttemptOutcome.RANK_FAILED, c.RANK_FAILED, "restarting every rank"
    reason = reason[:1024]
    draft.finish_attempt(outcome, measured=measured, reason=reason)
    draft.set(c.RUNNING, False, why, reason)
    draft.enter(Phase.REPLANNING, f"attempt {plan.attempt}: {reason}; {then} from the last checkpoint")
    draft.event(why, f"training Job {job.name}: {reason}", warning=True)


def _disrupted(job: JobSummary) -> bool:
    """The Job failed on its DisruptionTarget rule: the job controller's message names the condition
    ("Pod <ns>/<name> has condition DisruptionTarget matching FailJob rule at index 0"); an evicted or
    garbage-collected pod may be gone by now, so its own conditions cannot be read."""
    return job.failure_reason == "PodFailurePolicy" and "condition DisruptionTarget" in (job.failure_message or "")


def _over_plan(draft: Draft, snap: Snapshot, plan: Plan, job: JobSummary, peak: int, message: dict[str, object],
               digest: str) -> None:
    """The first steps measured more than the plan allows: re-plan before the OOM. The measured peak
    is learned (the next plan scales this configuration's prediction by it, so it escalates), and the
    next attempt resumes from the checkpoint the trainer saved when it stopped."""
    budget = message.get(KEY_BUDGET_BYTES)
    allowed = f"{gib(int(budget))} allowed" if isinstance(budget, int | float) else "over the plan"
    reason = (f"first-steps peak {gib(peak)} at step {message.get(KEY_STEP)} on {plan.node_pool} exceeds the "
              f"predicted {gib(plan.memory.peak_bytes)} + {plan.headroom_percent}% headroom ({allowed})")
    draft.finish_attempt(AttemptOutcome.MEMORY_OVER_PLAN, measured=peak, reason=reason)
    learn(draft, snap, plan, digest, measured=peak, oom=False, job=job)
    draft.set(c.RUNNING, False, c.MEMORY_OVER_PLAN, reason)
    draft.enter(Phase.REPLANNING, f"attempt {plan.attempt}: {reason}; re-planning before an out-of-memory")
    draft.event(c.MEMORY_OVER_PLAN, reason, warning=True)


def _blocked(draft: Draft, blocker: Blocker) -> None:
    """A training pod cannot start (its image, or a Secret or key it names: the hub token's, usually):
    said in the Running condition and the MESSAGE column, with one Event; the job fails once that lasted
    capacityTimeoutSeconds (the kubelet retries, so fixing it in time lets the pod start)."""
    if blocker.gives_up:
        draft.finish_attempt(AttemptOutcome.FAILED, reason=blocker.message[:1024])
        draft.fail(blocker.failure, blocker.failure_message())
        return
    if draft.condition_reason(c.RUNNING) != blocker.waiting:
        draft.event(blocker.waiting, blocker.message, warning=True)
    _block(draft, blocker.waiting, blocker.waiting_message())


def _unschedulable(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, plan: Plan, job: JobSummary
) -> None:
    stuck = [p for p in job.pods if p.unschedulable_since is not None]
    short = [p for p in stuck if not p.waits_for_claim]
    if not short:
        _waiting_for_volumes(draft, stuck)
        return
    since = min(p.unschedulable_since for p in short if p.unschedulable_since)
    current = draft.current
    if current is not None:
        # The scheduler keeps the PodScheduled condition's time while its reason changes: a pod that waited
        # for its claim and now finds no GPU has been short of capacity only from now on.
        if draft.condition_reason(c.RUNNING) == c.WAITING_FOR_VOLUME and current.capacity_wait_since is None:
            draft.update_current(capacity_wait_since=snap.now)
            current = draft.current
        if current is not None and current.capacity_wait_since is not None:
            since = max(since, current.capacity_wait_since)
    stuck = short
    waited = (snap.now - since).total_seconds()
    timeout = spec.recovery.capacity_timeout_seconds
    if waited >= timeout:
        reason = (
            f"pool {plan.node_pool} had no capacity for {int(waited)}s "
            f"(capacityTimeoutSeconds {timeout}): {stuck[0].unschedulable_message[:300]}"
        )
        draft.finish_attempt(AttemptOutcome.NO_CAPACITY, reason=reason)
        draft.set(c.RUNNING, False, c.NO_CAPACITY, reason)
        draft.enter(Phase.REPLANNING, f"attempt {plan.attempt}: {reason}; re-planning without it")
        draft.event(c.NO_CAPACITY, reason, warning=True)
        return
    # Said with the time it started, not a count of seconds: the message (and the stored status) stays the
    # same on every pass while the pods wait, so waiting costs no status write.
    since_text = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _block(draft, c.PODS_PENDING, f"{len(stuck)} pod(s) unschedulable on {plan.node_pool} since {since_text} "
                                  f"(capacityTimeoutSeconds {timeout})")


def _waiting_for_volumes(draft: Draft, stuck: list[PodSummary]) -> None:
    """Pods unschedulable only because their claims are not bound yet (a provisioner still at work, or a
    scheduler that has not seen the claim since an API server restart): no pool would take them sooner,
    so this is not counted against capacityTimeoutSeconds and starts no re-plan. Waits as the pods do;
    the message names the claims so that `kubectl describe pvc` is one step away."""
    since = min(p.unschedulable_since for p in stuck if p.unschedulable_since)
    claims = sorted({claim for p in stuck for claim in p.claims if claim})
    named = ", ".join(claims) if claims else "its PersistentVolumeClaims"
    since_text = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _block(draft, c.WAITING_FOR_VOLUME, f"{len(stuck)} pod(s) wait since {since_text} for {named} to be bound "
                                        f"(see `kubectl describe pvc`); not counted as missing capacity: "
                                        f"{stuck[0].unschedulable_message[:200]}")


def _pods_not_created(
    draft: Draft, snap: Snapshot, spec: MemoryOptimizedTrainingJobSpec, job: JobSummary
) -> bool:
    """Launching, and the Job controller created no pod within the capacity timeout: Failed.

    Counted from the Job controller's first sync (status.startTime): before it, the control plane has
    not looked at the Job yet (e.g. kube-controller-manager re-listing after an API server restart)
    and nothing has refused the pods."""
    current = draft.current
    if current is None or current.outcome != AttemptOutcome.LAUNCHING or not job.never_had_pods:
        return False
    started = job.started_at
    if started is None:
        return False
    waited = (snap.now - started).total_seconds()
    timeout = spec.recovery.capacity_timeout_seconds
    if waited < timeout:
        return False
    # Nothing will change by itself: without this the job would stay Launching forever.
    detail = (
        f"the Job controller created no pod of training Job {job.name} in {int(waited)}s "
        f"(capacityTimeoutSeconds {timeout}): a missing PriorityClass, a ResourceQuota or an admission "
        f"policy refuses them; see `kubectl describe job {job.name}`"
    )
    draft.finish_attempt(AttemptOutcome.FAILED, reason=detail)
    draft.fail(c.PODS_NOT_CREATED, detail)
    return True


def mib(value: int) -> str:
    return f"{value / 2**20:.1f}Mi"


def gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f}Gi"


def _spec_max_steps(snap: Snapshot, draft: Draft) -> int:
    if snap.spec is not None:
        return snap.spec.training.max_steps
    return draft.progress.max_steps if draft.progress is not None else 1
