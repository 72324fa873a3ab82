"""Depth-reduced calibration (memfit/memory/depth.py): per-depth fits are lines in the block count,
read at the full model's depth."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, Precision
from memfit.api.job import OptimizerKind
from memfit.api.problem import Problem
from memfit.api.profile import ActivationCurve, DepthProfile, Measurement, Profile, ReducedDepth
from memfit.memory import Shape, calibrate, memory_terms, predict_memory
from memfit.memory.calibration import _profile_strategy
from memfit.memory.curves import CurveFit
from memfit.memory.depth import extrapolate_curve, line_at, line_or_level, reduced_shape
from memfit.memory.problems import shape_from_problem
from memfit.memory.strategy import Device

GPT = {"builtin": {"kind": "gpt", "layers": 12, "hidden": 256, "heads": 4, "vocab": 2048, "sequenceLength": 256}}
MIB = 2**20


def full_shape() -> Shape:
    return Shape.of(shape_from_problem(Problem.model_validate(GPT)))


def reduced(d: int) -> ReducedDepth:
    full = full_shape()
    return ReducedDepth(blocks=d, parameters=full.parameters - (full.layers - d) * full.block_parameters)


def test_line_through_two_depths_is_read_at_the_full_depth() -> None:
    assert line_at([(1, 10.0), (2, 13.0)], 12) == pytest.approx(43.0)
    assert line_at([(1, 10.0)], 12) == 10.0  # one depth: nothing to scale
    assert line_at([(1, 10.0), (2, 13.0), (3, 16.0)], 12) == pytest.approx(43.0)


def test_reduced_shape_keeps_the_architecture_and_counts_the_reduced_parameters() -> None:
    full = full_shape()
    one = reduced_shape(full, reduced(1))
    assert (one.layers, one.hidden, one.vocab, one.tokens) == (1, full.hidden, full.vocab, full.tokens)
    assert one.parameters == full.parameters - 11 * full.block_parameters
    assert one.root_parameters == full.root_parameters and one.block_parameters == full.block_parameters


def test_curve_coefficients_are_extrapolated_per_block() -> None:
    fits = [(1, CurveFit(100.0, 10.0, 50.0, 3, 4)), (2, CurveFit(150.0, 14.0, 80.0, 3, 4))]
    fit = extrapolate_curve(fits, 12)
    assert (fit.fixed_bytes, fit.per_sample_bytes, fit.plateau_bytes) == pytest.approx((650.0, 54.0, 380.0))
    assert fit.measured


def _synthetic(residual_per_block: float, residual_fixed: float) -> Profile:
    """A reduced profile whose measurements are the analytic model plus a residual of
    `residual_fixed + d x residual_per_block` bytes alive with the activations."""
    full = full_shape()
    measurements = []
    for d in (1, 2):
        small = reduced_shape(full, reduced(d))
        for b in (1, 2):
            m = Measurement(precision=Precision.FP32, checkpointing=Checkpointing.NONE, micro_batch_size=b,
                            peak_allocated_bytes=0, step_seconds=0.1, blocks=d)
            strategy = _profile_strategy(m, OptimizerKind.ADAMW, Device.CPU)
            terms = memory_terms(small, strategy)
            backward = max(s + terms.static_bytes for s in (f + b * p for f, p in terms._lines[0]))
            backward += residual_fixed + d * residual_per_block
            step = terms.static_bytes + terms.step_gradient_bytes + terms.step_temporary_bytes
            measurements.append(m.model_copy(update={"peak_allocated_bytes": int(max(backward, step)),
                                                     "peak_backward_bytes": int(backward),
                                                     "peak_step_bytes": int(step)}))
    return Profile(problem_hash="x", device="cpu", shape=shape_from_problem(Problem.model_validate(GPT)),
                   measurements=measurements, optimizer="adamw",
                   depth=DepthProfile(layers=12, reduced=[reduced(1), reduced(2)]))


def test_a_per_block_residual_is_scaled_to_the_full_depth() -> None:
    profile = _synthetic(residual_per_block=2 * MIB, residual_fixed=1 * MIB)
    calibration = calibrate(profile, full_shape())
    residual = calibration.fixed_residuals[(Precision.FP32, Checkpointing.NONE)]
    assert residual == pytest.approx(1 * MIB + 12 * 2 * MIB, rel=1e-6)
    assert calibration.activation_scales[(Precision.FP32, Checkpointing.NONE)] == pytest.approx(1.0)
    assert calibration.notes[0] == "depth-reduced profile: blocks 1, 2 measured, terms scaled to 12 blocks"


def test_a_profile_that_agrees_with_the_model_predicts_the_analytic_full_depth_peak() -> None:
    profile = _synthetic(residual_per_block=0.0, residual_fixed=0.0)
    shape = full_shape()
    calibration = calibrate(profile, shape)
    m = Measurement(precision=Precision.FP32, checkpointing=Checkpointing.NONE, micro_batch_size=4,
                    peak_allocated_bytes=0, step_seconds=0.1)
    strategy = _profile_strategy(m, OptimizerKind.ADAMW, Device.CPU)
    assert predict_memory(shape, strategy, calibration=calibration).allocated_bytes == \
        predict_memory(shape, strategy).allocated_bytes


def test_curves_measured_at_two_depths_replace_the_analytic_activations_at_full_depth() -> None:
    curves = [ActivationCurve(precision=Precision.FP32, checkpointing=Checkpointing.NONE, blocks=d,
                              micro_batch_sizes=[1, 2, 4, 8], peak_bytes=[(5 + d) * MIB + b * (2 + d) * MIB
                                                                           for b in (1, 2, 4, 8)])
              for d in (1, 2)]
    profile = Profile(problem_hash="x", device="cpu", shape=shape_from_problem(Problem.model_validate(GPT)),
                      activation_curves=curves, optimizer="adamw",
                      depth=DepthProfile(layers=12, reduced=[reduced(1), reduced(2)]))
    fit = calibrate(profile, full_shape()).curves[(Precision.FP32, Checkpointing.NONE, False)]
    assert fit.per_sample_bytes == pytest.approx(14 * MIB) and fit.fixed_bytes == pytest.approx(17 * MIB)


def test_a_difference_between_depths_below_the_noise_is_not_multiplied_by_the_depth() -> None:
    # 0.1 MiB more per block is below 2 % of the 2-block peak: a quirk of the small models, not a
    # per-block term; the deeper depth's residual is kept as it is.
    profile = _synthetic(residual_per_block=0.1 * MIB, residual_fixed=1 * MIB)
    residual = calibrate(profile, full_shape()).fixed_residuals[(Precision.FP32, Checkpointing.NONE)]
    assert residual == pytest.approx(1.2 * MIB, rel=1e-6)
    assert line_or_level([(1, 10.0), (2, 13.0)], 12, noise_bytes=3.0) == 13.0
    assert line_or_level([(1, 10.0), (2, 13.0)], 12, noise_bytes=2.9) == pytest.approx(43.0)
