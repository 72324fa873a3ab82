"""Time model calibration from the measured step times of finished runs."""

from __future__ import annotations

import pytest
from memfit.catalog import CATALOG
from memfit.kube.profile_cache import Observation
from memfit.lifecycle.planning import measured_step_times
from memfit.planner import plan
from memfit.planner.measured_speed import MeasuredStepTime, step_time_factors
from planner_factories import make_job, make_pool

FACTORS = {
    "median of runs on one product": ([("NVIDIA-L4", 3.0, 2.0), ("NVIDIA-L4", 2.0, 2.0), ("nvidia-l4", 4.0, 2.0)],
                                      {"nvidia-l4": 1.5}),
    "products apart": ([("NVIDIA-L4", 2.0, 1.0), ("NVIDIA-A10G", 1.0, 2.0)], {"nvidia-l4": 2.0, "nvidia-a10g": 0.5}),
    "a broken measurement is bounded": ([("NVIDIA-L4", 100.0, 1.0)], {"nvidia-l4": 4.0}),
    "zero predicted: ignored": ([("NVIDIA-L4", 1.0, 0.0)], {}),
}


@pytest.mark.parametrize("case", FACTORS, ids=list(FACTORS))
def test_step_time_factors(case: str) -> None:
    runs, expected = FACTORS[case]
    assert step_time_factors([MeasuredStepTime(*r) for r in runs]) == pytest.approx(expected)


def test_only_finished_gpu_runs_with_both_step_times_calibrate() -> None:
    def seen(device: str, step: float | None, *, oom: bool = False) -> Observation:
        return Observation("k", "NVIDIA-L4", 1, 1, 1, oom, f"j/{device}{step}{oom}", device=device,
                           step_seconds=step, predicted_step_seconds=1.0)
    observations = [seen("NVIDIA-L4", 2.0), seen("cpu", 9.0), seen("NVIDIA-L4", 5.0, oom=True), seen("", None),
                    seen("", 3.0)]
    assert measured_step_times(observations) == [MeasuredStepTime("NVIDIA-L4", 2.0, 1.0),
                                                 MeasuredStepTime("NVIDIA-L4", 3.0, 1.0)]


def test_a_slower_measured_run_slows_later_plans_on_that_gpu_and_can_move_them() -> None:
    job = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).steps(1000).build()
    pools = [make_pool("l4", "l4"), make_pool("a10g", "a10g")]
    first = plan(job, pools=pools, catalog=CATALOG)
    assert first.plan is not None
    product, predicted = first.plan.gpu_product, first.plan.step_seconds
    slower = [MeasuredStepTime(product, predicted * 3, predicted)]
    only_there = plan(job, pools=[p for p in pools if p.metadata.name == first.plan.node_pool], catalog=CATALOG,
                      measured_step_times=slower)
    assert only_there.plan is not None
    # One GPU, no communication: the step is compute (and optimizer) time, so it follows the measurement.
    assert only_there.plan.step_seconds == pytest.approx(predicted * 3, rel=0.1)
    assert any("measured step times" in n for n in only_there.notes)
    moved = plan(job, pools=pools, catalog=CATALOG, measured_step_times=slower)
    assert moved.plan is not None and moved.plan.node_pool != first.plan.node_pool
