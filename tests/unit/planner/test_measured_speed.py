"""Time model calibration from the measured step times of finished runs."""

from __future__ import annotations

import math

import pytest
from memfit.api.common import Engine, Precision
from memfit.catalog import CATALOG
from memfit.kube.profile_cache import Observation
from memfit.lifecycle.planning import measured_step_times
from memfit.planner import plan
from memfit.planner.measured_speed import MeasuredStepTime, step_time_factors, with_measured_speed
from memfit.planner.offers import PoolRejection, resolve_offer
from memfit.timing import GpuSpeed, estimate_step_seconds, flops_per_sample
from memory_factories import LLAMA2_7B, S, hf_shape
from planner_factories import make_job, make_pool

BF16, FP32 = Precision.BF16, Precision.FP32
DDP, DS = Engine.DDP, Engine.DEEPSPEED
FACTORS = {
    "median of runs on one product": ([("NVIDIA-L4", 3.0, 2.0), ("NVIDIA-L4", 2.0, 2.0), ("nvidia-l4", 4.0, 2.0)],
                                      {("nvidia-l4", BF16, DDP): 1.5}),
    "products apart": ([("NVIDIA-L4", 2.0, 1.0), ("NVIDIA-A10G", 1.0, 2.0)],
                       {("nvidia-l4", BF16, DDP): 2.0, ("nvidia-a10g", BF16, DDP): 0.5}),
    "precisions apart": ([("NVIDIA-L4", 2.0, 1.0, FP32), ("NVIDIA-L4", 1.0, 1.0)],
                         {("nvidia-l4", FP32, DDP): 2.0, ("nvidia-l4", BF16, DDP): 1.0}),
    "engines apart": ([("NVIDIA-L4", 2.0, 1.0, BF16, DS), ("NVIDIA-L4", 1.0, 1.0)],
                      {("nvidia-l4", BF16, DS): 2.0, ("nvidia-l4", BF16, DDP): 1.0}),
    "a broken measurement is bounded": ([("NVIDIA-L4", 100.0, 1.0)], {("nvidia-l4", BF16, DDP): 4.0}),
    "zero predicted: ignored": ([("NVIDIA-L4", 1.0, 0.0)], {}),
    "not a number: ignored": ([("NVIDIA-L4", math.nan, 1.0), ("NVIDIA-L4", 1.0, math.inf)], {}),
}


@pytest.mark.parametrize("case", FACTORS, ids=list(FACTORS))
def test_step_time_factors(case: str) -> None:
    runs, expected = FACTORS[case]
    learned = step_time_factors([MeasuredStepTime(*r) for r in runs])
    assert {key: value.factor for key, value in learned.items()} == pytest.approx(expected)


def test_a_bounded_factor_says_so_and_never_beats_the_peak() -> None:
    offer = resolve_offer(make_pool("l4", "l4"), catalog=CATALOG)
    assert not isinstance(offer, PoolRejection)
    fast = with_measured_speed(offer, step_time_factors([MeasuredStepTime("NVIDIA-L4", 0.01, 1.0)]))
    assert fast.speed.learned == ((BF16, DDP, 0.25),)
    assert any("bounded to [0.25, 4]" in n for n in fast.notes)
    shape = hf_shape(LLAMA2_7B, seq=1024)
    strategy = S().ddp().bf16().mbs(1).build()
    flops_at_peak = flops_per_sample(shape) / fast.speed.peak_flops(BF16)
    step = estimate_step_seconds(shape, strategy, fast.speed)
    assert step.compute_seconds >= flops_at_peak  # a quarter of the roofline would beat the peak
    assert math.isfinite(step.step_seconds) and step.step_seconds > 0


def test_an_engine_not_measured_takes_the_median_at_its_precision_and_an_unmeasured_precision_only_a_slowdown() -> None:
    speed = GpuSpeed(bf16_tflops=121, fp16_tflops=121, fp32_tflops=30,
                     learned=((BF16, DS, 2.0), (BF16, Engine.FSDP, 3.0), (FP32, DDP, 0.5)))
    assert speed.learned_factor(BF16, DS) == 2.0
    assert speed.learned_factor(BF16, DDP) == 2.5  # median of the bf16 engines
    assert speed.learned_factor(Precision.FP16, DDP) == 2.0  # median of everything on this GPU: a slowdown
    faster = GpuSpeed(bf16_tflops=121, fp16_tflops=121, fp32_tflops=30, learned=((BF16, DS, 0.5),))
    assert faster.learned_factor(FP32, DDP) == 1.0  # a speedup is credited to its own precision only
    assert speed.lowest_learned_factor(BF16) == 1.0 and speed.lowest_learned_factor(FP32) == 0.5


def test_only_finished_gpu_runs_with_both_step_times_calibrate() -> None:
    key = "deepspeed/2/bf16/none/none/False/1/1/1/1"
    def seen(device: str, step: float | None, *, oom: bool = False, config: str = key) -> Observation:
        return Observation(config, "NVIDIA-L4", 1, 1, 1, oom, f"j/{device}{step}{oom}{config}", device=device,
                           step_seconds=step, predicted_step_seconds=1.0)
    observations = [seen("NVIDIA-L4", 2.0), seen("cpu", 9.0), seen("NVIDIA-L4", 5.0, oom=True), seen("", None),
                    seen("", 3.0), seen("", 4.0, config="k")]
    assert measured_step_times(observations) == [MeasuredStepTime("NVIDIA-L4", 2.0, 1.0, BF16, DS),
                                                 MeasuredStepTime("NVIDIA-L4", 3.0, 1.0, BF16, DS)]


def test_a_slower_measured_run_slows_later_plans_on_that_gpu_and_can_move_them() -> None:
    job = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).steps(1000).build()
    pools = [make_pool("l4", "l4"), make_pool("a10g", "a10g")]
    first = plan(job, pools=pools, catalog=CATALOG)
    assert first.plan is not None
    product, predicted = first.plan.gpu_product, first.plan.step_seconds
    slower = [MeasuredStepTime(product, predicted * 3, predicted, first.plan.precision, first.plan.engine)]
    only_there = plan(job, pools=[p for p in pools if p.metadata.name == first.plan.node_pool], catalog=CATALOG,
                      measured_step_times=slower)
    assert only_there.plan is not None
    # The GPU-seconds per step follow the measurement (the plan may spread the slower steps over more GPUs).
    later = only_there.plan
    assert later.precision == first.plan.precision  # a slow bf16 does not make an unmeasured fp32 look fast
    assert later.step_seconds * later.world_size == pytest.approx(predicted * first.plan.world_size * 3, rel=0.1)
    assert any("measured step times were 3.00x" in n for n in only_there.notes)
    assert any("measured step times were 3.00x" in n for n in later.cost_notes)  # the status shows it too
    moved = plan(job, pools=pools, catalog=CATALOG, measured_step_times=slower)
    assert moved.plan is not None and moved.plan.node_pool != first.plan.node_pool


def test_learning_compares_with_the_model_before_learned_factors_so_it_settles() -> None:
    """A GPU whose compute is truly 2x slower than modelled: every run teaches 2x, never a drifting median
    of ratios against predictions that already carried the previous factor (the review's 2.0 -> 1.0 -> 1.33)."""
    job = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).steps(1000).build()
    pools = [make_pool("l4", "l4")]
    measured: list[MeasuredStepTime] = []
    factors = []
    for _ in range(4):
        p = plan(job, pools=pools, catalog=CATALOG, measured_step_times=measured).plan
        assert p is not None and p.model_step_seconds is not None and p.model_compute_seconds is not None
        truth = 2 * p.model_compute_seconds + (p.model_step_seconds - p.model_compute_seconds)
        measured.append(MeasuredStepTime(p.gpu_product, truth, p.model_step_seconds, p.precision, p.engine,
                                         predicted_compute_seconds=p.model_compute_seconds))
        learned = step_time_factors(measured)[(p.gpu_product.lower(), p.precision, p.engine)]
        factors.append(learned.factor)
    assert factors == pytest.approx([2.0] * 4, rel=1e-3)
    last = plan(job, pools=pools, catalog=CATALOG, measured_step_times=measured).plan
    # 2x compute plus the modelled rest (a longer compute hides a little more communication).
    assert last is not None and last.step_seconds == pytest.approx(
        2 * last.model_compute_seconds + last.model_step_seconds - last.model_compute_seconds, rel=0.03)
