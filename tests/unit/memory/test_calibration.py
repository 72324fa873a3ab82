"""Calibration: the activation slope and fixed residual fitted from measured micro-batches."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, Precision
from memfit.api.profile import Measurement, Profile
from memfit.memory import Calibration, calibrate, memory_terms
from memfit.memory.activations import activation_terms
from memfit.memory.states import model_states
from memfit.memory.temporaries import fixed_temporaries
from memory_factories import GPT2, S, hf_shape

SHAPE = hf_shape(GPT2, seq=1024)
EXTRA_FIXED = 200 * 1024**2
SLOPE_FACTOR = 1.3


def truth_allocated(precision: Precision, checkpointing: Checkpointing, micro_batch: int) -> int:
    """A 'measured' single-process peak that differs from the model by known amounts."""
    strategy = S().ddp()._set(precision=precision, checkpointing=checkpointing).mbs(micro_batch).build()
    states, temps = model_states(SHAPE, strategy), fixed_temporaries(SHAPE, strategy)
    acts = activation_terms(SHAPE, strategy)
    slope = (acts.activation_bytes_per_sample + acts.temporary_bytes_per_sample) * SLOPE_FACTOR
    fixed = (states.parameters_bytes + states.optimizer_bytes + temps.backward_bytes
             + temps.first_gradient_bytes + EXTRA_FIXED)
    return round(fixed + micro_batch * slope)


def measurement(precision: Precision, checkpointing: Checkpointing, micro_batch: int,
                reserved_factor: float | None = None) -> Measurement:
    allocated = truth_allocated(precision, checkpointing, micro_batch)
    return Measurement(
        precision=precision, checkpointing=checkpointing, micro_batch_size=micro_batch,
        peak_allocated_bytes=allocated, step_seconds=0.1,
        peak_reserved_bytes=round(allocated * reserved_factor) if reserved_factor else None,
    )


def profile_of(*measurements: Measurement) -> Profile:
    return Profile(problem_hash="abc", measurements=list(measurements))


BF16, NONE, FULL = Precision.BF16, Checkpointing.NONE, Checkpointing.FULL


def test_two_micro_batches_recover_slope_and_fixed_residual() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 2), measurement(BF16, NONE, 6)), SHAPE)
    assert calibration.activation_scale(BF16, NONE) == pytest.approx(SLOPE_FACTOR)
    assert calibration.fixed_residual(BF16, NONE) == pytest.approx(EXTRA_FIXED, rel=1e-6)


@pytest.mark.parametrize("micro_batch", [1, 4, 16])
def test_calibrated_prediction_reproduces_the_measurement_at_other_micro_batches(micro_batch: int) -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 2), measurement(BF16, NONE, 6)), SHAPE)
    terms = memory_terms(SHAPE, S().ddp().bf16().build(), calibration=calibration)
    ddp_buckets = 4 * SHAPE.trainable  # the trainer wraps DDP; the profiler's single process does not
    assert terms.allocated_bytes(micro_batch, 1) == pytest.approx(
        truth_allocated(BF16, NONE, micro_batch) + ddp_buckets, rel=1e-9
    )


def test_unmeasured_checkpointing_borrows_the_same_precision() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 1), measurement(BF16, NONE, 3)), SHAPE)
    assert calibration.activation_scale(BF16, FULL) == pytest.approx(SLOPE_FACTOR)
    assert calibration.fixed_residual(Precision.FP32, NONE) == 0.0


def test_one_micro_batch_puts_the_whole_error_on_the_fixed_residual() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 4)), SHAPE)
    assert calibration.activation_scale(BF16, NONE) == 1.0
    strategy = S().ddp().bf16().build()
    acts = activation_terms(SHAPE, strategy)
    slope = acts.activation_bytes_per_sample + acts.temporary_bytes_per_sample
    assert calibration.fixed_residual(BF16, NONE) == pytest.approx(EXTRA_FIXED + 4 * (SLOPE_FACTOR - 1) * slope,
                                                                   rel=1e-6)
    assert any("error assigned to the fixed residual" in note for note in calibration.notes)


def test_reserved_over_allocated_sets_fragmentation() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 1, 1.2), measurement(BF16, NONE, 2, 1.25)), SHAPE)
    assert calibration.fragmentation == pytest.approx(1.225, abs=1e-3)
    terms = memory_terms(SHAPE, S().ddp().bf16().build(), calibration=calibration)
    assert terms.fragmentation == calibration.fragmentation


def test_no_measurements_change_nothing() -> None:
    strategy = S().deepspeed(2).bf16().world(4).build()
    plain = memory_terms(SHAPE, strategy)
    empty = memory_terms(SHAPE, strategy, calibration=Calibration())
    assert plain == empty


def test_borrowed_corrections_only_raise_predictions() -> None:
    shrink = Calibration(activation_scales={(BF16, NONE): 0.5}, fixed_residuals={(BF16, NONE): -1e6})
    assert shrink.activation_scale(BF16, NONE) == 0.5  # measured: used as is
    assert shrink.activation_scale(BF16, FULL) == 1.0  # borrowed: never below 1
    assert shrink.activation_scale(Precision.FP32, FULL) == 1.0
    assert shrink.fixed_residual(BF16, FULL) == 0.0


def test_points_peaking_in_the_optimizer_step_are_not_used_for_the_activation_fit() -> None:
    # Full checkpointing at micro-batch 1 on GPT-2 with an fp32 foreach AdamW: the step phase
    # (params + moments + gradients + the sqrt temporary) is higher than backward.
    calibration = calibrate(profile_of(measurement(Precision.FP32, FULL, 1), measurement(BF16, NONE, 2),
                                       measurement(BF16, NONE, 6)), SHAPE)
    assert any("peak in the optimizer step" in note for note in calibration.notes)
    assert (Precision.FP32, FULL) not in calibration.activation_scales
    # What the step point measured goes to the step: truth_allocated adds EXTRA_FIXED above the
    # backward phase, which in this point is below the step phase.
    assert Precision.FP32 in calibration.step_residuals
