"""Measured peaks: auto-downsizing after an over-prediction, caution after an under-prediction."""

from __future__ import annotations

from dataclasses import replace

from memfit.catalog import CATALOG
from memfit.memory import Shape, Strategy, memory_terms, shape_from_hf_config
from memfit.planner import MeasuredPeak, plan
from memfit.planner.measured import peak_corrections
from planner_factories import LLAMA_1B_CONFIG, make_job, make_pool

SHAPE = Shape.of(shape_from_hf_config(LLAMA_1B_CONFIG, sequence_length=2048))
SPEC = make_job().hf(LLAMA_1B_CONFIG).batch(16).build()
POOLS = [make_pool("l40s", "l40s"), make_pool("a100-80", "a100-80")]


def predicted(s: Strategy) -> float:
    return memory_terms(SHAPE, s).peak_bytes(s.config.micro_batch_size, s.config.gradient_accumulation_steps)


def test_factors_by_family_and_world_size_and_a_cautious_default() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    corrections = peak_corrections([MeasuredPeak(s, int(predicted(s) * 0.8))], SHAPE)
    assert abs(corrections.factor(s) - 0.8) < 1e-6
    other_world = replace(s, world_size=s.world_size * 2)
    assert abs(corrections.factor(other_world) - 0.8) < 1e-6  # same family, latest observation
    unrelated = s.with_config(optimizer8bit=not s.config.optimizer8bit)
    assert corrections.factor(unrelated) == 1.0  # over-predictions never shrink unmeasured configurations


def test_an_under_prediction_makes_every_prediction_cautious() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    corrections = peak_corrections([MeasuredPeak(s, int(predicted(s) * 1.3))], SHAPE)
    unrelated = s.with_config(optimizer8bit=not s.config.optimizer8bit)
    assert abs(corrections.default_factor - 1.3) < 1e-6 and abs(corrections.factor(unrelated) - 1.3) < 1e-6


def test_measured_lower_peak_lets_a_bigger_micro_batch_fit() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    again = plan(SPEC, pools=[make_pool(first.pool, first.pool)],
                 measured_peaks=[MeasuredPeak(s, int(predicted(s) * 0.5))], catalog=CATALOG).chosen
    assert again is not None and again.total_cost <= first.total_cost


def test_oom_at_capacity_moves_the_plan_off_that_configuration() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    oom = MeasuredPeak(first.strategy, first.usable_bytes)  # CUDA OOM: the peak is at least the capacity
    replanned = plan(SPEC, pools=POOLS, measured_peaks=[oom], catalog=CATALOG).chosen
    assert replanned is not None
    same = (replanned.pool, replanned.strategy) == (first.pool, first.strategy)
    assert not same and replanned.memory.peak_bytes * 1.1 <= replanned.usable_bytes
