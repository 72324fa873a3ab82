"""decide(snapshot): every lifecycle transition, without a cluster (tests/unit/lifecycle/lifecycle_harness.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import pytest
from lifecycle_harness import T0, Harness, busy_world, profile_message, quickstart, terminated
from memfit.api.common import Checkpointing, Precision
from memfit.api.job import AttemptOutcome, MemoryOptimizedTrainingJobSpec, Phase
from memfit.api.profile import Profile, SkippedRun
from memfit.lifecycle import Delete, Ensure, WriteData
from memfit.memory.problems import shape_from_problem

PROFILE_JOB = "Job/j-profile"
TRAIN_CHILDREN = {"ConfigMap/j-plan-0", "Service/j", "Job/j-train-0"}
OOM = json.dumps({"reason": "CUDAOutOfMemory", "peakBytes": 15 * 2**30, "step": 3, "rank": 0})


def launched(**spec: object) -> Harness:
    """A job with a cached profile, reconciled once: attempt 0 Launching."""
    h = Harness(spec=quickstart(**spec))
    h.seed_profile()
    h.reconcile()
    assert h.stored.phase == Phase.LAUNCHING
    return h


def running(**spec: object) -> Harness:
    h = launched(**spec)
    h.start("j-train-0")
    h.add_pod("j-train-0")
    h.reconcile()
    assert h.stored.phase == Phase.RUNNING
    return h


def assert_idempotent(h: Harness) -> None:
    """A second reconcile of the same world writes nothing and changes nothing."""
    before = (h.status, h.children(), len(h.writes))
    decision = h.reconcile()
    assert decision.effects == () and decision.events == ()
    assert (h.status, h.children(), len(h.writes)) == before


# --- profiling ---------------------------------------------------------------------------------------
def test_new_job_profiles_first() -> None:
    h = Harness()
    decision = h.reconcile()
    assert [type(e) for e in decision.effects] == [Ensure, Ensure]
    assert h.children() == {"ConfigMap/j-profile", PROFILE_JOB}
    assert h.stored.phase == Phase.PROFILING
    assert h.condition("Profiled") == ("False", "Profiling", "profiling on pool t4-spot (Job j-profile)")
    assert decision.reasons() == ["Profiling"]
    pool = h.job("j-profile")["spec"]["template"]["spec"]["nodeSelector"]
    assert pool == {"memfit.dev/pool": "t4-spot"}  # the cheapest pool per GPU with a free GPU
    assert_idempotent(h)


def test_finished_profiling_is_cached_and_launches_in_the_same_pass() -> None:
    h = Harness()
    h.reconcile()
    h.add_pod("j-profile", phase="Succeeded", **terminated(0, profile_message(h.spec), "Completed"))
    h.finish("j-profile")
    decision = h.reconcile()
    writes = [e for e in decision.effects if isinstance(e, WriteData)]
    assert [w.manifest["metadata"]["name"] for w in writes] == [h.stored.profile.config_map]  # type: ignore[union-attr]
    assert decision.profile_seconds == 12.5
    assert decision.reasons() == ["ProfileMeasured", "PlanFound"]
    assert h.stored.profile is not None and h.stored.profile.source == "measured"
    assert h.stored.phase == Phase.LAUNCHING and h.children() >= TRAIN_CHILDREN
    assert_idempotent(h)


def test_a_profile_that_skipped_what_its_gpu_refused_says_so_and_plans_around_it() -> None:
    h = Harness()
    h.reconcile()
    problem = MemoryOptimizedTrainingJobSpec.model_validate(h.spec).problem
    # Unrefused, this job plans fp32 on t4-spot; the profile, taken on a T4, could not run fp32 there.
    skipped = [SkippedRun(kind="configuration", precision=Precision.FP32, checkpointing=ckpt, micro_batch_size=1,
                          reason="NotImplementedError: no fp32 kernel") for ckpt in (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL)]
    message = Profile(problem_hash="x", device="cuda:t4", shape=shape_from_problem(problem), seconds=3.0,
                      skipped=skipped).to_json()
    h.add_pod("j-profile", phase="Succeeded", **terminated(0, message, "Completed"))
    h.finish("j-profile")
    decision = h.reconcile()
    assert decision.reasons() == ["ProfileMeasured", "PlanFound"]
    status, reason, text = h.condition("Profiled")
    assert (status, reason) == ("True", "ProfileMeasured")
    assert text.endswith("; cuda:t4 could not run fp32/full, fp32/none, fp32/selective (NotImplementedError: no "
                         "fp32 kernel): skipped, never planned on this GPU")
    plan = h.stored.plan
    assert plan is not None and plan.node_pool.startswith("t4")
    assert plan.precision == "fp16"


def test_a_cpu_profiles_skips_are_words_only() -> None:
    """A CPU kernel's gap says nothing about a GPU's: the condition says the terms are analytic."""
    from memfit.lifecycle.profiling import skipped_words

    profile = Profile(problem_hash="x", device="cpu", skipped=[
        SkippedRun(kind="curve", precision=Precision.BF16, checkpointing=Checkpointing.FULL,
                   reason="TypeError: Got unsupported ScalarType BFloat16")])
    assert skipped_words(profile) == ("cpu could not run bf16/full (TypeError: Got unsupported ScalarType BFloat16): "
                                      "skipped, planned from the analytic terms")


FAILED_PROFILING: dict[str, tuple[Callable[[Harness], None], str]] = {
    "profiler reports an error": (
        lambda h: (
            h.add_pod(
                "j-profile",
                phase="Failed",
                **terminated(3, json.dumps({"problemHash": "x", "error": "no such model"})),
            ),
            h.finish("j-profile", failed=True, reason="BackoffLimitExceeded"),
        ),
        "profiler: no such model",
    ),
    "profiler crashes without a Profile": (
        lambda h: (
            h.add_pod("j-profile", phase="Failed", **terminated(1, "Traceback: boom")),
            h.finish("j-profile", failed=True, reason="BackoffLimitExceeded"),
        ),
        "profiling pod j-profile-0 failed (exit code 1): Traceback: boom; Job BackoffLimitExceeded",
    ),
    "profiling Job hits its deadline": (
        lambda h: h.finish(
            "j-profile",
            failed=True,
            reason="DeadlineExceeded",
            message="Job was active longer than specified deadline",
        ),
        "profiling Job j-profile failed: Job was active longer than specified deadline",
    ),
}


@pytest.mark.parametrize("case", FAILED_PROFILING, ids=list(FAILED_PROFILING))
def test_profiling_failure_fails_the_job(case: str) -> None:
    fail, message = FAILED_PROFILING[case]
    h = Harness()
    h.reconcile()
    fail(h)
    decision = h.reconcile()
    assert h.stored.phase == Phase.FAILED
    assert h.condition("Failed") == ("True", "ProfilingFailed", message)
    assert decision.reasons() == ["ProfilingFailed"]
    # What the operator counts and does next comes with the decision (no event-reason matching).
    assert decision.profiling_failed and decision.replans == () and decision.requeue
    assert not any(c.startswith("Job/j-train") for c in h.children())
    assert_idempotent(h)


def test_unschedulable_profiling_pod_is_placed_again_then_times_out() -> None:
    h = Harness(
        spec=quickstart(
            profiling={"timeoutSeconds": 300}, recovery={"maxReplans": 3, "capacityTimeoutSeconds": 60}
        )
    )
    h.reconcile()
    h.unschedulable("j-profile", since=T0)
    h.later(59)
    assert h.reconcile().effects == ()  # under min(capacityTimeout, profiling timeout / 2)
    h.later(1)
    decision = h.reconcile()
    assert decision.effects == (Delete("j-profile"),)
    assert decision.reasons() == ["ProfilingRescheduled"]
    assert PROFILE_JOB not in h.children()
    h.reconcile()  # placed again
    assert PROFILE_JOB in h.children()
    h.unschedulable("j-profile", since=h.now)
    h.later(300)
    decision = h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "ProfilingFailed")
    assert message.startswith("profiling pod found no GPU for 360s (profiling.timeoutSeconds 300)")


def test_named_profiling_pool_that_does_not_exist_fails() -> None:
    h = Harness(spec=quickstart(profiling={"nodePool": "h100-nope"}))
    decision = h.reconcile()
    assert h.condition("Failed")[:2] == ("True", "ProfilingFailed")
    assert (
        "'h100-nope' is not a GPUNodePool (pools: a100-80-ondemand, l4-ondemand, t4-spot)"
        in h.condition("Failed")[2]
    )
    assert decision.effects == ()


CACHED: dict[str, tuple[dict[str, object], str, list[str]]] = {
    "reuse allowed: straight to launch": ({}, "cached", ["ProfileCached", "PlanFound"]),
    "reuse off: profiles anyway": ({"profiling": {"reuse": False}}, "", ["Profiling"]),
}


@pytest.mark.parametrize("case", CACHED, ids=list(CACHED))
def test_cached_profile_reuse(case: str) -> None:
    spec, source, reasons = CACHED[case]
    h = Harness(spec=quickstart(**spec))
    h.seed_profile()
    decision = h.reconcile()
    assert decision.reasons() == reasons
    if source:
        assert h.stored.profile is not None and h.stored.profile.source == source
        assert h.children() >= TRAIN_CHILDREN and PROFILE_JOB not in h.children()
    else:
        assert h.stored.phase == Phase.PROFILING and PROFILE_JOB in h.children()


# --- planning and launch -----------------------------------------------------------------------------
def test_launch_builds_the_children_in_crash_safe_order() -> None:
    h = Harness()
    h.seed_profile()
    decision = h.reconcile()
    ensured = [
        f"{e.manifest['kind']}/{e.manifest['metadata']['name']}"
        for e in decision.effects
        if isinstance(e, Ensure)
    ]
    # The plan record first, the checkpoint claim before the Job whose pods mount it.
    assert ensured == ["ConfigMap/j-plan-0", "Service/j", "PersistentVolumeClaim/j-checkpoints", "Job/j-train-0"]
    assert [e.record for e in decision.effects if isinstance(e, Ensure)] == [True, False, False, False]
    status = h.stored
    assert status.plan is not None and status.plan.node_pool == h.plan_json(0)["nodePool"]
    assert status.plan.savings is not None and status.plan.baseline_cost_per_hour is not None
    attempt = status.attempts[0]
    assert (attempt.index, attempt.outcome, attempt.started_at) == (0, AttemptOutcome.LAUNCHING, T0)
    assert h.condition("Planned")[:2] == ("True", "PlanFound")
    assert h.condition("Running") == ("False", "Launching", "training Job j-train-0 created")
    assert_idempotent(h)


def test_busy_pools_wait_for_capacity_without_children() -> None:
    h = Harness(world=busy_world())
    h.seed_profile()
    decision = h.reconcile()
    assert h.stored.phase == Phase.PLANNING
    status, reason, message = h.condition("Planned")
    assert (status, reason) == ("False", "WaitingForCapacity") and "fits but its GPUs are in use" in message
    assert decision.reasons() == ["ProfileCached", "WaitingForCapacity"]
    assert not any("train" in c for c in h.children())
    assert_idempotent(h)  # no second WaitingForCapacity event while still waiting
    h.world = Harness().world
    h.reconcile()
    assert h.stored.phase == Phase.LAUNCHING


def test_no_fit_fails_with_a_reason_per_pool() -> None:
    huge = {
        "builtin": {
            "kind": "gpt",
            "layers": 80,
            "hidden": 8192,
            "heads": 64,
            "vocab": 32000,
            "sequenceLength": 4096,
        }
    }
    h = Harness(
        spec=quickstart(
            problem=huge,
            placement={"maxNodes": 1, "baseline": {"nodePool": "a100-80-ondemand"}},
            strategy={"precision": "fp32", "offload": "none", "activationCheckpointing": "none"},
        )
    )
    h.seed_profile()
    decision = h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "NoFit")
    assert all(pool in message for pool in ("t4-spot", "l4-ondemand", "a100-80-ondemand"))
    assert h.condition("Planned") == ("False", "NoFit", message)
    # NoFit is said once: by the reason of the condition and the event, as the prefix of status.message.
    assert not message.startswith("NoFit") and h.stored.message == f"NoFit: {message}"
    assert [(e.reason, e.message) for e in decision.events if e.reason == "NoFit"] == [("NoFit", message)]
    assert not any("train" in c for c in h.children())


def test_kueue_job_is_created_suspended_and_waits_for_admission() -> None:
    h = launched(scheduling={"kueueQueue": "team-a"})
    assert h.job("j-train-0")["spec"]["suspend"] is True
    h.reconcile()
    status, reason, message = h.condition("Running")
    assert (status, reason) == ("False", "WaitingForAdmission") and "LocalQueue team-a" in message


# --- monitoring --------------------------------------------------------------------------------------
def test_all_pods_running_is_running() -> None:
    h = running()
    assert h.stored.attempts[-1].outcome == AttemptOutcome.RUNNING
    assert h.condition("Running")[:2] == ("True", "PodsRunning")
    assert_idempotent(h)


def test_a_job_whose_pods_all_run_needs_a_look_only_for_its_progress() -> None:
    """Every later change of a running job shows in its Job's status (watched): the resync only has to
    refresh status.progress, so the decision asks for the next look after progress_seconds."""
    h = launched()
    h.start("j-train-0")
    assert h.reconcile().recheck_after is None  # no pod yet: the resync interval
    h.add_pod("j-train-0")
    assert h.reconcile().recheck_after == 15.0


def test_a_job_with_a_pod_not_running_is_looked_at_every_resync() -> None:
    h = running()
    h.add_pod("j-train-0", 1, phase="Pending")  # a replacement waiting for a node
    decision = h.reconcile()
    assert decision.recheck_after is None


def test_success_records_the_measured_peak_and_a_cpu_allocator_peak_teaches_the_tensor_terms() -> None:
    h = running()
    done = json.dumps({"reason": "Completed", "peakBytes": 3 * 2**20, "memoryMeter": "cpu-allocator-profiler",
                       "rankPeaks": [3 * 2**20], "device": "cpu", "stepSeconds": 0.25})
    h.pods["j-train-0-0"]["status"] = {"phase": "Succeeded", **terminated(0, done, "Completed")}
    h.finish("j-train-0")
    decision = h.reconcile()
    status = h.stored
    assert status.phase == Phase.SUCCEEDED and status.measured_peak_bytes == 3 * 2**20
    assert status.attempts[-1].outcome == AttemptOutcome.SUCCEEDED
    assert h.condition("Succeeded")[:2] == ("True", "TrainingSucceeded")
    assert "measured peak 3.0Mi on cpu-allocator-profiler (CPU stand-in" in h.condition("Succeeded")[2]
    assert "learned for the tensor terms" in h.condition("Succeeded")[2]
    assert decision.reasons() == ["TrainingSucceeded"]
    (write,) = decision.effects  # allocator tensor bytes are learned from a CPU run too
    assert isinstance(write, WriteData)
    (seen,) = json.loads(write.manifest["data"]["observations.json"])
    assert (seen["kind"], seen["device"], seen["rankPeaks"], seen["stepSeconds"]) == ("allocated", "cpu", [3 * 2**20], 0.25)
    assert "reservedPeakBytes" not in seen
    assert_idempotent(h)


@pytest.mark.parametrize(("device", "meter", "learned"), [("simulated-cuda", "simulated-gpu", False),
                                                          ("cuda", "cuda-allocator", True)])
def test_a_step_time_is_learned_as_a_gpu_speed_only_from_a_real_gpu(device: str, meter: str, learned: bool) -> None:
    """The test bed's simulated GPU runs on the CPU: its step times are not a GPU's speed (issue #30)."""
    h = running()
    done = json.dumps({"reason": "Completed", "peakBytes": 3 * 2**20, "memoryMeter": meter,
                       "rankPeaks": [3 * 2**20], "device": device, "stepSeconds": 0.25,
                       "reservedPeakBytes": 4 * 2**20})
    h.pods["j-train-0-0"]["status"] = {"phase": "Succeeded", **terminated(0, done, "Completed")}
    h.finish("j-train-0")
    write = next(e for e in h.reconcile().effects if isinstance(e, WriteData))
    (seen,) = json.loads(write.manifest["data"]["observations.json"])
    assert ("stepSeconds" in seen) is learned
    assert seen["rankPeaks"] == [3 * 2**20]  # the memory is learned either way


def test_a_process_rss_peak_is_reported_not_learned() -> None:
    h = running()
    done = json.dumps({"reason": "Completed", "peakBytes": 300 * 2**20, "memoryMeter": "cpu-rss"})
    h.pods["j-train-0-0"]["status"] = {"phase": "Succeeded", **terminated(0, done, "Completed")}
    h.finish("j-train-0")
    decision = h.reconcile()
    assert decision.effects == () and "not learned" in h.condition("Succeeded")[2]


def test_gpu_measured_peaks_are_learned_per_rank_with_their_kind_and_device() -> None:
    h = running()
    done = json.dumps({"reason": "Completed", "peakBytes": 2**30, "memoryMeter": "cuda-allocator", "device": "cuda",
                       "rankPeaks": [2**30 - 5, 2**30], "reservedPeakBytes": 2**30 + 2**28})
    h.pods["j-train-0-0"]["status"] = {"phase": "Succeeded", **terminated(0, done, "Completed")}
    h.finish("j-train-0")
    decision = h.reconcile()
    (write,) = decision.effects
    assert isinstance(write, WriteData) and write.exists
    observations = json.loads(write.manifest["data"]["observations.json"])
    plan = h.plan_json(0)
    assert [(o["job"], o["measuredPeakBytes"], o["outOfMemory"], o["kind"], o["device"], o["rankPeaks"],
             o["reservedPeakBytes"]) for o in observations] == [
        ("j/0", 2**30, False, "allocated", plan["gpuProduct"], [2**30 - 5, 2**30], 2**30 + 2**28)
    ]


def oom(h: Harness) -> None:
    h.pods["j-train-0-0"]["status"] = {"phase": "Failed", **terminated(87, OOM)}
    h.finish("j-train-0", failed=True, reason="PodFailurePolicy")


def test_oom_replans_with_escalation() -> None:
    h = running()
    first = h.plan_json(0)
    oom(h)
    decision = h.reconcile()
    status = h.stored
    assert status.phase == Phase.REPLANNING
    assert decision.replans == (AttemptOutcome.OUT_OF_MEMORY,) and decision.requeue and not decision.profiling_failed
    assert status.attempts[0].outcome == AttemptOutcome.OUT_OF_MEMORY
    assert status.attempts[0].measured_peak_bytes == 15 * 2**30
    assert status.attempts[0].reason == f"CUDAOutOfMemory at step 3 on {first['nodePool']} (peak 15.00Gi)"
    assert decision.reasons() == ["OutOfMemory"]
    assert [type(e) for e in decision.effects] == [WriteData]  # the OOM is learned; the Job stays for now
    assert "Job/j-train-0" in h.children()
    decision = h.reconcile()  # the re-plan: outcome stored, so attempt 0's Job goes first
    assert decision.effects[0] == Delete("j-train-0")
    assert decision.reasons() == ["Replanning"]
    assert {"ConfigMap/j-plan-1", "Job/j-train-1"} <= h.children() and "Job/j-train-0" not in h.children()
    second = h.plan_json(1)
    config = (
        "engine",
        "zeroStage",
        "precision",
        "activationCheckpointing",
        "offload",
        "microBatchSize",
        "nodePool",
    )
    assert [first[k] for k in config] != [second[k] for k in config]  # not the configuration that ran out
    # The re-plan keeps the effective global batch and says so, in the event and the Planned condition.
    effective = second["nodes"] * second["gpusPerNode"] * second["microBatchSize"] * second[
        "gradientAccumulationSteps"]
    assert effective == h.spec["training"]["globalBatchSize"]
    words = (f"keeps the effective global batch {effective} = {second['nodes'] * second['gpusPerNode']} GPUs x "
             f"micro-batch {second['microBatchSize']} x accumulation {second['gradientAccumulationSteps']}")
    assert words in decision.events[-1].message and words in h.condition("Planned")[2]
    assert h.stored.attempts[1].outcome == AttemptOutcome.LAUNCHING and h.stored.phase == Phase.REPLANNING
    assert_idempotent(h)


def test_replans_exhausted_fails() -> None:
    h = running(recovery={"maxReplans": 0, "capacityTimeoutSeconds": 60})
    oom(h)
    h.reconcile()
    decision = h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "ReplansExhausted")
    assert message.startswith("1 attempts, last: CUDAOutOfMemory at step 3") and message.endswith(
        "recovery.maxReplans is 0"
    )
    assert decision.effects == (Delete("j-train-0"),)
    assert "Job/j-train-1" not in h.children()


def test_host_oom_killed_is_an_oom_too() -> None:
    h = running()
    h.pods["j-train-0-0"]["status"] = {"phase": "Failed", **terminated(137, "", "OOMKilled")}
    h.finish("j-train-0", failed=True)
    h.reconcile()
    assert h.stored.attempts[0].outcome == AttemptOutcome.OUT_OF_MEMORY
    assert h.stored.attempts[0].reason.startswith("HostOutOfMemory at step None")


CAPACITY: dict[str, tuple[int, str, str]] = {
    "pending under the capacity timeout": (59, "PodsPending", "1 pod(s) unschedulable on t4-spot since "),
    "capacity timeout falls back": (60, "NoCapacity", "had no capacity for 60s (capacityTimeoutSeconds 60)"),
}


@pytest.mark.parametrize("case", CAPACITY, ids=list(CAPACITY))
def test_unschedulable_training_pods(case: str) -> None:
    waited, reason, message = CAPACITY[case]
    h = launched()
    h.start("j-train-0")
    h.unschedulable("j-train-0", since=T0)
    h.later(waited)
    h.reconcile()
    assert h.condition("Running")[:2] == ("False", reason) and message in h.condition("Running")[2]


def test_pods_waiting_for_capacity_cost_no_status_write_per_pass() -> None:
    """The PodsPending message names when the wait started, not how long it has lasted: a pass while the
    pods still wait changes nothing."""
    h = launched()
    h.start("j-train-0")
    h.unschedulable("j-train-0", since=T0)
    h.later(5)
    h.reconcile()
    assert h.condition("Running")[2].startswith("1 pod(s) unschedulable on t4-spot since 20")
    before = h.status
    h.later(20)
    assert_idempotent(h)
    assert h.status == before


def test_capacity_fallback_replans_without_the_pool() -> None:
    h = launched()
    first_pool = h.plan_json(0)["nodePool"]
    h.start("j-train-0")
    h.unschedulable("j-train-0", since=T0)
    h.later(60)
    decision = h.reconcile()
    assert decision.reasons() == ["NoCapacity"] and h.stored.phase == Phase.REPLANNING
    assert h.stored.attempts[0].outcome == AttemptOutcome.NO_CAPACITY
    h.reconcile()
    assert h.plan_json(1)["nodePool"] != first_pool
    assert h.stored.attempts[1].node_pool != first_pool


def test_job_controller_creating_no_pods_fails() -> None:
    h = launched()
    h.reconcile()
    h.start("j-train-0")
    h.later(59)
    assert h.reconcile().effects == () and h.stored.phase == Phase.LAUNCHING
    h.later(1)
    h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "PodsNotCreated")
    assert "created no pod of training Job j-train-0 in 60s" in message
    assert h.stored.attempts[0].outcome == AttemptOutcome.FAILED


def test_no_start_time_means_no_pods_not_created_yet() -> None:
    h = launched()
    h.later(3600)  # the Job controller has not synced the Job (e.g. re-listing after a restart)
    h.reconcile()
    assert h.stored.phase == Phase.LAUNCHING


def test_invalid_plan_fails_without_replanning() -> None:
    h = running()
    refused = json.dumps({"reason": "InvalidPlan", "message": "zeroStage 3 needs deepspeed"})
    h.pods["j-train-0-0"]["status"] = {"phase": "Failed", **terminated(88, refused)}
    h.finish("j-train-0", failed=True)
    h.reconcile()
    assert h.condition("Failed") == ("True", "InvalidPlan", "zeroStage 3 needs deepspeed")
    assert h.stored.attempts[0].outcome == AttemptOutcome.FAILED


def test_training_failure_fails_with_the_pod_message() -> None:
    h = running()
    h.pods["j-train-0-0"]["status"] = {"phase": "Failed", **terminated(1, "Traceback: nan loss")}
    h.finish(
        "j-train-0",
        failed=True,
        reason="BackoffLimitExceeded",
        message="Job has reached the specified backoff limit",
    )
    h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "TrainingFailed")
    assert (
        message
        == "training Job j-train-0 failed: Job has reached the specified backoff limit; "
        "pod j-train-0-0 exited 1 (Error): Traceback: nan loss"
    )


# --- invalid specs, terminal jobs, lost children and lost status --------------------------------------
def test_invalid_spec_fails_without_children() -> None:
    h = Harness(spec=quickstart(strategy={"engine": "ddp", "zeroStage": 3}))
    decision = h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "InvalidSpec") and "spec.strategy.zeroStage" in message
    assert decision.effects == () and h.children() == set()
    assert decision.reasons() == ["InvalidSpec"]
    assert_idempotent(h)


def test_name_too_long_is_an_invalid_spec() -> None:
    h = Harness(name="x" * 41)
    h.reconcile()
    assert h.condition("Failed")[:2] == ("True", "InvalidSpec")
    assert h.children() == set()


def test_terminal_job_decides_nothing() -> None:
    h = running()
    h.finish("j-train-0")
    h.reconcile()
    assert h.stored.phase == Phase.SUCCEEDED
    h.finish("j-train-0", failed=True)  # whatever happens to the children now
    assert_idempotent(h)


def test_deleted_training_job_is_rebuilt_from_the_plan_record() -> None:
    h = running()
    del h.objects[("Job", "j-train-0")]
    h.pods.clear()
    decision = h.reconcile()
    assert "Job/j-train-0" in h.children()
    assert json.loads(h.job("j-train-0")["metadata"]["annotations"]["memfit.dev/plan-json"]) == h.plan_json(0)
    assert decision.reasons() == []


def test_lost_plan_record_and_job_replans() -> None:
    h = running()
    del h.objects[("Job", "j-train-0")]
    del h.objects[("ConfigMap", "j-plan-0")]
    h.reconcile()
    attempt = h.stored.attempts[0]
    assert (attempt.outcome, attempt.reason) == (AttemptOutcome.NO_CAPACITY, "plan record lost; re-planning")


RESTARTS: dict[str, Callable[[], Harness]] = {
    "status lost while profiling": lambda: _profiling(),
    "status lost after launch": launched,
    "status lost while running": running,
}


def _profiling() -> Harness:
    h = Harness()
    h.reconcile()
    return h


@pytest.mark.parametrize("case", RESTARTS, ids=list(RESTARTS))
def test_lost_status_leads_to_the_same_decisions_without_duplicates(case: str) -> None:
    h = RESTARTS[case]()
    before = h.stored
    children, writes = h.children(), len(h.writes)
    plan_record = h.objects.get(("ConfigMap", "j-plan-0"))
    h.status = {}  # e.g. restored from a backup without status, or an operator that lost its write
    h.reconcile()
    assert h.children() == children and len(h.writes) == writes  # nothing created twice
    after = h.stored
    assert after.plan == before.plan  # rebuilt from the stored plan record: baseline and savings too
    if before.attempts:
        assert [(a.index, a.node_pool, a.nodes) for a in after.attempts] == [
            (a.index, a.node_pool, a.nodes) for a in before.attempts
        ]
        assert h.objects[("ConfigMap", "j-plan-0")] == plan_record


def test_clock_is_the_only_time_source() -> None:
    h = launched()
    assert h.stored.attempts[0].started_at == T0
    h.later(0.9)  # sub-second clocks are truncated: a reconcile a moment later changes nothing
    assert h.now - T0 < timedelta(seconds=1)
    assert_idempotent(h)


# --- the profile cache key ----------------------------------------------------------------------------
def _args(h: Harness) -> list[str]:
    return list(h.job("j-profile")["spec"]["template"]["spec"]["containers"][0]["args"])


def test_profile_job_measures_the_jobs_optimizer() -> None:
    h = Harness(spec=quickstart(training={"optimizer": "sgd"}, strategy={"optimizer8bit": "disabled"}))
    h.reconcile()
    args = _args(h)
    assert args[args.index("--optimizer") + 1] == "sgd"
    assert args[args.index("--optimizer8bit") + 1] == "off"


def test_profile_job_checks_and_measures_the_adapters_a_peft_job_allows() -> None:
    h = Harness(spec=quickstart(strategy={"peft": {"method": "auto", "allowed": ["none", "qlora"],
                                                   "lora": {"rank": 4}}}))
    h.reconcile()
    args = _args(h)
    assert args[args.index("--lora-targets") + 1] == "qkv,proj,fc,out"
    assert args[args.index("--lora-rank") + 1] == "4"
    assert args[args.index("--peft-methods") + 1] == "qlora"


CACHE_MISSES: dict[str, dict[str, object]] = {
    "another optimizer": {"training": {"optimizer": "sgd"}},
    "peft allowed": {"strategy": {"peft": {"method": "lora"}}},
    "8-bit disabled": {"strategy": {"optimizer8bit": "disabled"}},
    "another trainer image": {"image": "example.org/memfit-trainer:other"},
    "another profiling product": {"profiling": {"nodePool": "l4-ondemand"}},
}


@pytest.mark.parametrize("case", CACHE_MISSES, ids=list(CACHE_MISSES))
def test_a_profile_of_another_optimizer_image_or_product_is_not_reused(case: str) -> None:
    """The cached AdamW profile of the same problem (measured on the default image and the cheapest
    pool's product) is not the profile of a job that differs in any of them: it profiles afresh."""
    seeded = Harness()
    seeded.seed_profile()
    h = Harness(spec=quickstart(**CACHE_MISSES[case]), objects=dict(seeded.objects))
    assert h.reconcile().reasons() == ["Profiling"]


def test_the_key_is_kept_once_profiled() -> None:
    """After the profile, the key in status.profile is the cache the job reads and learns into, even
    when the pools (hence the cheapest product) changed since."""
    h = launched()
    key = h.stored.profile.problem_hash if h.stored.profile else None
    assert key and any(name == f"memfit-profile-{key}" for kind, name in h.objects if kind == "ConfigMap")


def test_first_steps_over_the_plan_replans_before_an_oom() -> None:
    h = running()
    first = h.plan_json(0)
    predicted = first["memory"]["peakBytes"]
    peak = 3 * predicted  # far above prediction + headroom
    message = json.dumps({"reason": "MemoryOverPlan", "peakBytes": peak, "step": 2, "rank": 0,
                          "budgetBytes": int(predicted * 1.1), "memoryMeter": "cuda-allocator"})
    h.pods["j-train-0-0"]["status"] = {"phase": "Failed", **terminated(89, message)}
    h.finish("j-train-0", failed=True, reason="PodFailurePolicy")
    decision = h.reconcile()
    attempt = h.stored.attempts[0]
    assert h.stored.phase == Phase.REPLANNING
    assert attempt.outcome == AttemptOutcome.MEMORY_OVER_PLAN and attempt.measured_peak_bytes == peak
    assert attempt.reason.startswith(f"first-steps peak {peak / 2**30:.2f}Gi at step 2 on {first['nodePool']} "
                                     "exceeds the predicted")
    assert h.condition("Running")[:2] == ("False", "MemoryOverPlan")
    assert decision.reasons() == ["MemoryOverPlan"]
    (write,) = decision.effects  # the measured peak is learned (not as an OOM: it is a real measurement)
    assert isinstance(write, WriteData)
    observations = json.loads(write.manifest["data"]["observations.json"])
    assert [(o["measuredPeakBytes"], o["outOfMemory"]) for o in observations] == [(peak, False)]
    def checkpoint_dir(job: str) -> str:
        env = h.job(job)["spec"]["template"]["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "MEMFIT_CHECKPOINT_DIR")

    folder = checkpoint_dir("j-train-0")
    decision = h.reconcile()
    assert decision.effects[0] == Delete("j-train-0") and decision.reasons() == ["Replanning"]
    second = h.plan_json(1)
    assert second["memory"]["peakBytes"] > predicted  # planned with the measured peak
    assert checkpoint_dir("j-train-1") == folder  # the next attempt resumes from the saved checkpoint
    assert_idempotent(h)


def test_inject_peak_factor_reaches_the_first_attempt_only() -> None:
    from memfit.lifecycle.launch import fault_injection

    annotations = {"memfit.dev/inject-peak-factor": "20"}
    assert fault_injection(annotations, 0) == {"MEMFIT_INJECT_PEAK_FACTOR": "20.0"}
    assert fault_injection(annotations, 1) == {}
    assert fault_injection({**annotations, "memfit.dev/inject-peak-attempts": "2"}, 1) == {
        "MEMFIT_INJECT_PEAK_FACTOR": "20.0"}


# --- spend -------------------------------------------------------------------------------------------
def test_spend_counts_profiling_and_every_finished_attempt_failed_ones_included() -> None:
    h = Harness()
    h.reconcile()
    h.start("j-profile")
    h.later(360)  # six minutes of one t4-spot GPU
    h.add_pod("j-profile", phase="Succeeded", **terminated(0, profile_message(h.spec), "Completed"))
    h.finish("j-profile")
    h.reconcile()
    spend = h.stored.spend
    assert spend is not None and [i.kind for i in spend.items] == ["profiling"]
    profiling = spend.items[0]
    assert (profiling.node_pool, profiling.gpus, profiling.seconds, profiling.outcome) == ("t4-spot", 1, 360, "Profiled")
    assert profiling.cost == pytest.approx(0.1 * profiling.price_per_hour)
    assert spend.predicted == h.stored.plan.estimated_cost  # type: ignore[union-attr]
    first = h.plan_json(0)
    h.add_pod("j-train-0")
    h.reconcile()
    h.later(1800)
    oom(h)
    h.reconcile()  # the OOM attempt's half hour counts
    spend = h.stored.spend
    assert spend is not None and [(i.kind, i.attempt, i.outcome) for i in spend.items] == [
        ("profiling", None, "Profiled"), ("training", 0, "OutOfMemory")]
    failed = spend.items[1]
    assert failed.seconds == 1800 and failed.cost == pytest.approx(0.5 * first["pricePerHour"])
    assert failed.gpu_hours == pytest.approx(0.5 * first["nodes"] * first["gpusPerNode"])
    assert spend.total == pytest.approx(profiling.cost + failed.cost)
    h.reconcile()  # the re-plan: attempt 1 runs, the spend so far is unchanged
    assert h.stored.spend is not None and h.stored.spend.items == spend.items
    assert_idempotent(h)



# --- a multi-node gang: a failed rank restarts every rank ----------------------------------------------
# A 1.3B-parameter GPT whose pinned ZeRO-3 fp16 states need both T4s of t4-spot: a 2-node plan.
BIG = {"builtin": {"kind": "gpt", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 50304, "sequenceLength": 512}}


def two_node_gang(**recovery: object) -> Harness:
    h = Harness(spec=quickstart(
        problem=BIG, training={"globalBatchSize": 8, "maxSteps": 10, "checkpoint": {"volumeClaim": "ckpt"}},
        strategy={"engine": "deepspeed", "zeroStage": 3, "offload": "none", "precision": "fp16"},
        placement={"nodePools": ["t4-spot"], "maxNodes": 2},
        recovery={"maxReplans": 0, "capacityTimeoutSeconds": 600, **recovery}))
    h.objects[("PersistentVolumeClaim", "ckpt")] = {"spec": {"accessModes": ["ReadWriteMany"]}}  # every node's
    h.seed_profile()
    h.reconcile()
    assert h.stored.phase == Phase.LAUNCHING and h.plan_json(0)["nodes"] == 2
    h.start("j-train-0")
    h.add_pod("j-train-0", 0)
    h.add_pod("j-train-0", 1)
    h.reconcile()
    assert h.stored.phase == Phase.RUNNING
    return h


def fail_rank_1(h: Harness, attempt: int) -> None:
    """Rank 1's trainer crashed; the Job's failure policy failed the Job and ended rank 0 with it."""
    job = f"j-train-{attempt}"
    h.pods[f"{job}-1"]["status"] = {"phase": "Failed", **terminated(1, "Traceback: RuntimeError: boom")}
    h.pods[f"{job}-0"]["status"] = {"phase": "Failed", **terminated(143, "", reason="Error")}
    h.finish(job, failed=True, reason="PodFailurePolicy",
             message=f"Container trainer for pod default/{job}-1 failed with exit code 1 matching FailJob rule at "
                     "index 1")  # fmt: skip


def test_a_failed_rank_restarts_every_rank_from_the_checkpoint_within_max_restarts() -> None:
    h = two_node_gang(maxRestarts=1)
    fail_rank_1(h, 0)
    decision = h.reconcile()
    first = h.stored.attempts[0]
    assert first.outcome == AttemptOutcome.RANK_FAILED and h.stored.phase == Phase.REPLANNING
    assert first.reason.startswith("a rank of the 2-node gang failed: Container trainer for pod default/j-train-0-1")
    assert first.reason.endswith("pod j-train-0-1 exited 1 (Error): Traceback: RuntimeError: boom"), first.reason
    assert decision.replans == (AttemptOutcome.RANK_FAILED,) and "RankFailed" in decision.reasons()
    assert h.condition("Running")[:2] == ("False", "RankFailed")
    # The next pass deletes the failed attempt's Job and launches the same plan again (maxReplans 0 is not
    # spent: a restart is not a re-plan), whose ranks resume from the checkpoint.
    decision = h.reconcile()
    assert decision.effects[0] == Delete("j-train-0")
    assert "Job/j-train-1" in h.children() and "Job/j-train-0" not in h.children()
    config = ("engine", "zeroStage", "precision", "nodes", "nodePool", "microBatchSize")
    assert [h.plan_json(0)[k] for k in config] == [h.plan_json(1)[k] for k in config]
    # A second rank failure is one more than recovery.maxRestarts: the job fails, saying so.
    h.start("j-train-1")
    h.add_pod("j-train-1", 0)
    h.add_pod("j-train-1", 1)
    h.reconcile()
    fail_rank_1(h, 1)
    h.reconcile()
    h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "RestartsExhausted")
    assert message.startswith("2 rank failures, last: a rank of the 2-node gang failed") and message.endswith(
        "recovery.maxRestarts is 1")
    assert "Job/j-train-2" not in h.children()


def test_a_single_node_training_failure_still_fails_the_job() -> None:
    # One node: the Job's backoff already retried the pod (a replacement rejoins nothing): Failed.
    h = running(recovery={"maxRestarts": 3, "maxReplans": 3, "capacityTimeoutSeconds": 60})
    h.pods["j-train-0-0"]["status"] = {"phase": "Failed", **terminated(1, "Traceback: nan loss")}
    h.finish("j-train-0", failed=True, reason="BackoffLimitExceeded", message="backoff")
    h.reconcile()
    assert h.condition("Failed")[:2] == ("True", "TrainingFailed")
    assert [a.outcome for a in h.stored.attempts] == [AttemptOutcome.FAILED]


def test_a_disrupted_rank_replans_onto_the_capacity_left_and_spends_a_replan_not_a_restart() -> None:
    h = two_node_gang(maxRestarts=0, maxReplans=1)
    h.pods["j-train-0-1"]["status"] = {"phase": "Failed", **terminated(143, "", reason="Error")}
    h.finish("j-train-0", failed=True, reason="PodFailurePolicy",
             message="Pod default/j-train-0-1 has condition DisruptionTarget matching FailJob rule at index 0")
    decision = h.reconcile()
    first = h.stored.attempts[0]
    assert first.outcome == AttemptOutcome.RANK_DISRUPTED and decision.replans == (AttemptOutcome.RANK_DISRUPTED,)
    assert first.reason.startswith("a rank of the 2-node gang was disrupted (node drained, lost or pre-empted)")
    assert h.condition("Running")[:2] == ("False", "RankDisrupted")
    h.reconcile()  # maxRestarts 0 is not spent: the next attempt is launched
    assert "Job/j-train-1" in h.children() and h.condition("Failed")[0] != "True"
