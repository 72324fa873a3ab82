"""What the probe of a job's own container teaches the planner (memfit.lifecycle.probe_points): the profiler's
Profile from its init container, the probe's points from the pod's container, each measured micro-batch an
observation of the probed configuration that the planner learns like an attempt's peak, and a finding that
fails the profiling in the probe's words."""

from __future__ import annotations

import json
from typing import Any

from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.profile import Profile
from memfit.catalog import CATALOG
from memfit.lifecycle.observed import JobSummary, summarize_pod
from memfit.lifecycle.planning import measured_peaks, strategy_of
from memfit.lifecycle.probe_points import (
    probe_config,
    probe_failure,
    probe_observations,
    probe_words,
    read_probe,
)
from memfit.lifecycle.profiling import profile_from
from memfit.memory.predict import memory_terms
from memfit.memory.problems import shape_from_problem
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy
from memfit.planner.measured import PeakKind, peak_corrections
from memfit_testbed.own_code_cases import LOOP, job_spec

A100 = CATALOG.find("a100-80")
SPEC = MemoryOptimizedTrainingJobSpec.model_validate(job_spec(LOOP))
PROFILE = Profile(problem_hash="ab" * 8, device="cpu")


def _point(batch: int, outcome: str = "measured", peak: int | None = None) -> dict[str, Any]:
    return {"microBatch": batch, "outcome": outcome, "stepsSeen": 3, "peakBytes": peak, "reservedPeakBytes": None,
            "firstStepPeakBytes": peak, "stepSeconds": 0.01, "fedMicroBatch": batch,
            "memoryMeter": "cpu-allocator", "device": "cpu"}  # fmt: skip


def _job(points: list[dict[str, Any]], findings: tuple[str, ...] = ()) -> JobSummary:
    terminated = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    pod = {"metadata": {"name": "own-profile-x"}, "spec": {"containers": [{"name": "probe", "image": "team/train"}]},
           "status": {"phase": "Succeeded",
                      "initContainerStatuses": [
                          {"name": "memfit-probe", "state": terminated},
                          {"name": "profiler", "state": {"terminated": {"exitCode": 0, "message": PROFILE.to_json()}}}],
                      "containerStatuses": [{"name": "probe", "state": {"terminated": {
                          "exitCode": 0, "message": json.dumps({"points": points, "findings": list(findings)})}}}]}}
    return JobSummary(name="own-profile", exists=True, complete=True, pods=(summarize_pod(pod),))  # fmt: skip


def test_the_profile_comes_from_the_profiler_init_container_and_the_points_from_the_probe() -> None:
    job = _job([_point(1, peak=80 << 20), _point(2, peak=100 << 20)])
    profile, error = profile_from(job)
    assert error == "" and profile == PROFILE
    reading, error = read_probe(job)
    assert error == "" and reading is not None and probe_failure(reading) == ""
    config = probe_config(SPEC, A100)
    observations = probe_observations(reading, config, gpu_product=A100.product, gpu_memory_bytes=80 << 30, job="own")
    assert [o.config_key for o in observations] == ["ddp/0/bf16/none/none/0/1/1/1/1", "ddp/0/bf16/none/none/0/1/1/2/1"]
    assert [o.measured_peak_bytes for o in observations] == [80 << 20, 100 << 20]
    assert all(o.device == "cpu" and not o.on_gpu for o in observations)
    assert "micro-batch 1: 80.0 MiB, 2: 100.0 MiB" in probe_words(observations, config)
    strategy = strategy_of(observations[1].config_key, SPEC)
    assert strategy is not None and strategy.world_size == 1 and strategy.config.micro_batch_size == 2


def test_the_planner_scales_the_probed_configuration_by_what_the_script_allocated() -> None:
    shape = Shape.of(shape_from_problem(SPEC.problem))
    config = probe_config(SPEC, A100)
    strategy = Strategy(config=config.model_copy(update={"micro_batch_size": 2}), world_size=1)
    predicted = memory_terms(shape, strategy).allocated_bytes(2, 1)
    job = _job([_point(1, peak=int(predicted * 1.2)), _point(2, peak=int(predicted * 1.5))])
    reading, _ = read_probe(job)
    assert reading is not None
    observations = probe_observations(reading, config, gpu_product=A100.product, gpu_memory_bytes=0, job="own")
    peaks, _ = measured_peaks(observations, SPEC)
    assert all(p.kind == PeakKind.ALLOCATED for p in peaks)
    corrections = peak_corrections(peaks, shape)
    assert abs(corrections.factor(strategy) - 1.5) < 1e-6  # the probed family: the script's measured ratio
    other = Strategy(config=config.model_copy(update={"precision": "fp32"}), world_size=2)
    assert corrections.factor(other) >= 1.5  # unmeasured ones: at least as cautious


def test_a_finding_fails_the_profiling_in_the_probes_words() -> None:
    finding = "the script ran micro-batch 8 where memfit planned 1: it does not honor microBatchSize"
    reading, _ = read_probe(_job([_point(1, outcome="ignores-micro-batch", peak=5)], (finding,)))
    assert reading is not None
    assert probe_failure(reading) == f"spec.container under memfit's probe: {finding}"
    reading, _ = read_probe(_job([_point(1, outcome="out-of-memory")]))
    assert reading is not None and "no micro-batch measured (micro-batch 1: out-of-memory)" in probe_failure(reading)


def test_an_out_of_memory_rung_is_a_bound_on_the_gpu() -> None:
    reading, _ = read_probe(_job([_point(1, peak=5 << 20), _point(2, outcome="out-of-memory")]))
    assert reading is not None and probe_failure(reading) == ""
    observations = probe_observations(reading, probe_config(SPEC, A100), gpu_product=A100.product,
                                      gpu_memory_bytes=80 << 30, job="own")  # fmt: skip
    assert [o.out_of_memory for o in observations] == [False, True]
    peaks, _ = measured_peaks(observations, SPEC)
    assert [p.kind for p in peaks] == [PeakKind.ALLOCATED, PeakKind.DEVICE] and peaks[1].peak_bytes == 80 << 30


def test_a_probe_that_wrote_nothing_names_the_container_that_failed() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "probe", "image": "team/train"}]},
           "status": {"phase": "Failed", "containerStatuses": [{"name": "probe", "state": {"terminated": {
               "exitCode": 127, "reason": "Error", "message": "exec: python3: not found"}}}]}}
    _, error = read_probe(JobSummary(name="j", exists=True, failed=True, pods=(summarize_pod(pod),)))
    assert error.startswith("the probe of spec.container wrote no summary: pod p exited 127")
    assert "python3: not found" in error
