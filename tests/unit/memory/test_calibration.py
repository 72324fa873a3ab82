"""Calibration: the activation slope and residuals fitted from measured phase peaks."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, Precision
from memfit.api.profile import Measurement, Profile
from memfit.memory import Calibration, Device, calibrate, memory_terms
from memory_factories import GPT2, S, hf_shape

SHAPE = hf_shape(GPT2, seq=1024)
EXTRA_FIXED = 200 * 1024**2
EXTRA_STEP = 300 * 1024**2
SLOPE_FACTOR = 1.3
PROFILED_ON = "cuda:NVIDIA-H100-80GB-HBM3"

BF16, FP32, NONE, FULL = Precision.BF16, Precision.FP32, Checkpointing.NONE, Checkpointing.FULL


def ddp(precision: Precision, checkpointing: Checkpointing, micro_batch: int = 1) -> object:
    return S().ddp()._config(precision=precision, activation_checkpointing=checkpointing).mbs(micro_batch).build()


def truth_backward(precision: Precision, checkpointing: Checkpointing, micro_batch: int) -> int:
    """A 'measured' forward+backward peak: the loss moment with a steeper slope and extra fixed bytes."""
    t = memory_terms(SHAPE, ddp(precision, checkpointing))  # type: ignore[arg-type]
    loss_fixed = t.static_bytes + t.with_activations_bytes
    loss, first, last = t.activation_moments(1)
    assert loss.total(1) >= max(first.total(1), last.total(1))  # the loss is this model's peak moment
    return round(loss_fixed + EXTRA_FIXED + micro_batch * t.per_sample_bytes * SLOPE_FACTOR)


def truth_step(precision: Precision, checkpointing: Checkpointing) -> int:
    t = memory_terms(SHAPE, ddp(precision, checkpointing))  # type: ignore[arg-type]
    return round(t.static_bytes + t.step_gradient_bytes + t.step_temporary_bytes + EXTRA_STEP)


def measurement(precision: Precision, checkpointing: Checkpointing, micro_batch: int, *,
                reserved_factor: float | None = None, phases: bool = True) -> Measurement:
    backward = truth_backward(precision, checkpointing, micro_batch)
    step = truth_step(precision, checkpointing)
    allocated = max(backward, step)
    return Measurement(
        precision=precision, checkpointing=checkpointing, micro_batch_size=micro_batch,
        peak_allocated_bytes=allocated, step_seconds=0.1,
        peak_reserved_bytes=round(allocated * reserved_factor) if reserved_factor else None,
        peak_backward_bytes=backward if phases else None,
        peak_step_bytes=step if phases else None,
    )


def profile_of(*measurements: Measurement, device: str = PROFILED_ON) -> Profile:
    return Profile(problem_hash="abc", device=device, measurements=list(measurements))


def test_two_micro_batches_recover_slope_and_both_residuals() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 2), measurement(BF16, NONE, 6)), SHAPE)
    strategy = ddp(BF16, NONE)
    assert calibration.device == Device.CUDA
    assert calibration.activation_scale(strategy) == pytest.approx(SLOPE_FACTOR)  # type: ignore[arg-type]
    assert calibration.fixed_residual(strategy) == pytest.approx(EXTRA_FIXED, rel=1e-6)  # type: ignore[arg-type]
    assert calibration.step_residual(strategy) == pytest.approx(EXTRA_STEP, rel=1e-6)  # type: ignore[arg-type]


@pytest.mark.parametrize("micro_batch", [1, 4, 16])
def test_calibrated_prediction_reproduces_the_measurements(micro_batch: int) -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 2), measurement(BF16, NONE, 6)), SHAPE)
    terms = memory_terms(SHAPE, ddp(BF16, NONE), calibration=calibration)  # type: ignore[arg-type]
    expected = max(truth_backward(BF16, NONE, micro_batch), truth_step(BF16, NONE))
    assert terms.allocated_bytes(micro_batch, 1) == pytest.approx(expected, rel=1e-9)


def test_residuals_stay_with_the_profiled_engine_and_device() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 2), measurement(BF16, NONE, 6)), SHAPE)
    fsdp = S().fsdp(3).bf16().world(8).build()
    on_cpu = S().ddp().bf16()._set(device=Device.CPU).build()
    for other in (fsdp, on_cpu):
        assert calibration.fixed_residual(other) == 0.0
        assert calibration.step_residual(other) == 0.0
        assert calibration.activation_scale(other) == pytest.approx(SLOPE_FACTOR)  # > 1: carried over


def test_unmeasured_checkpointing_borrows_the_same_precision() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 1), measurement(BF16, NONE, 3)), SHAPE)
    assert calibration.activation_scale(ddp(BF16, FULL)) == pytest.approx(SLOPE_FACTOR)  # type: ignore[arg-type]
    assert calibration.fixed_residual(ddp(FP32, NONE)) == 0.0  # type: ignore[arg-type]


def test_one_micro_batch_puts_the_whole_error_on_the_fixed_residual() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 4)), SHAPE)
    strategy = ddp(BF16, NONE)
    assert calibration.activation_scale(strategy) == 1.0  # type: ignore[arg-type]
    slope = memory_terms(SHAPE, strategy).per_sample_bytes  # type: ignore[arg-type]
    assert calibration.fixed_residual(strategy) == pytest.approx(  # type: ignore[arg-type]
        EXTRA_FIXED + 4 * (SLOPE_FACTOR - 1) * slope, rel=1e-6)
    assert any("error assigned to the fixed residual" in note for note in calibration.notes)


def test_reserved_over_allocated_sets_fragmentation() -> None:
    calibration = calibrate(profile_of(measurement(BF16, NONE, 1, reserved_factor=1.2),
                                       measurement(BF16, NONE, 2, reserved_factor=1.25)), SHAPE)
    assert calibration.fragmentation == pytest.approx(1.225, abs=1e-3)
    terms = memory_terms(SHAPE, ddp(BF16, NONE), calibration=calibration)  # type: ignore[arg-type]
    assert terms.fragmentation == calibration.fragmentation


def test_no_measurements_change_nothing() -> None:
    strategy = S().deepspeed(2).bf16().world(4).build()
    assert memory_terms(SHAPE, strategy) == memory_terms(SHAPE, strategy, calibration=Calibration())


def test_borrowed_corrections_only_raise_predictions() -> None:
    shrink = Calibration(activation_scales={(BF16, NONE): 0.5}, fixed_residuals={(BF16, NONE): -1e6})
    assert shrink.activation_scale(ddp(BF16, NONE)) == 0.5  # type: ignore[arg-type]  # measured: as is
    assert shrink.activation_scale(ddp(BF16, FULL)) == 1.0  # type: ignore[arg-type]  # borrowed: >= 1
    assert shrink.activation_scale(ddp(FP32, FULL)) == 1.0  # type: ignore[arg-type]
    assert shrink.activation_scale(S().fsdp(3).bf16().build()) == 1.0  # another engine: >= 1
    assert shrink.fixed_residual(ddp(BF16, FULL)) == 0.0  # type: ignore[arg-type]


def test_points_without_phase_peaks_go_to_the_phase_the_model_predicts() -> None:
    # Older profiles carry only the overall peak. Full checkpointing at micro-batch 1 on GPT-2 with
    # fp32 foreach AdamW peaks in the optimizer step: that point measures the step, not activations.
    step_point = measurement(FP32, FULL, 1, phases=False)
    t = memory_terms(SHAPE, ddp(FP32, FULL))  # type: ignore[arg-type]
    assert t.at(1, 1).phase == "step"
    calibration = calibrate(profile_of(step_point, measurement(BF16, NONE, 2), measurement(BF16, NONE, 6)), SHAPE)
    assert (FP32, FULL) not in calibration.activation_scales
    assert any("not used for the activation fit" in note for note in calibration.notes)
    assert False in calibration.step_residuals


def test_measurements_the_model_already_reproduces_change_nothing() -> None:
    # Points within 2 % of the analytic model: no slope is fitted from what would be noise.
    def exact(micro_batch: int) -> Measurement:
        t = memory_terms(SHAPE, ddp(BF16, NONE, micro_batch))  # type: ignore[arg-type]
        backward = round(t.static_bytes + t.with_activations_bytes + micro_batch * t.per_sample_bytes * 1.01)
        step = round(t.static_bytes + t.step_gradient_bytes + t.step_temporary_bytes)
        return Measurement(precision=BF16, checkpointing=NONE, micro_batch_size=micro_batch,
                           peak_allocated_bytes=max(backward, step), step_seconds=0.1,
                           peak_backward_bytes=backward, peak_step_bytes=step)

    calibration = calibrate(profile_of(exact(2), exact(6)), SHAPE)
    strategy = ddp(BF16, NONE)
    assert calibration.activation_scale(strategy) == 1.0  # type: ignore[arg-type]
    assert calibration.fixed_residual(strategy) == 0.0  # type: ignore[arg-type]
    assert any("within 2%" in note for note in calibration.notes)
