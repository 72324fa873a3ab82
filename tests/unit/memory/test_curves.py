"""Measured activation curves: the fit (memory/curves.py) and its use by calibration and prediction."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import OptimizerKind
from memfit.api.profile import ActivationCurve, Measurement, Profile
from memfit.api.training_config import TrainingConfig
from memfit.memory import Device, Shape, Strategy, calibrate, memory_terms, predict_memory
from memfit.memory.curves import fit_curve
from memory_factories import model_shape

MIB = 2**20
SIZES = [1, 2, 4, 8, 16]


def _law(fixed: float, per: float, plateau: float, plateau_per: float = 0.0) -> list[int]:
    return [round(max(plateau + plateau_per * b, fixed + per * b)) for b in SIZES]


@pytest.mark.parametrize(
    ("fixed", "per", "plateau", "plateau_per", "on_line"),
    [
        pytest.param(1 * MIB, 3 * MIB, 0.0, 0.0, 5, id="pure line: every point on it"),
        pytest.param(0.5 * MIB, 1 * MIB, 6 * MIB, 0.0, 2, id="flat gradient plateau up to b=4"),
        pytest.param(0.0, 2 * MIB, 9 * MIB, 0.25 * MIB, 2, id="rising plateau under b=8"),
    ],
)
def test_fit_recovers_line_and_plateau(fixed: float, per: float, plateau: float, plateau_per: float,
                                       on_line: int) -> None:
    peaks = _law(fixed, per, plateau, plateau_per)
    fit = fit_curve(SIZES, peaks)
    assert fit.measured
    assert fit.points_used == on_line
    assert fit.per_sample_bytes == pytest.approx(per, rel=1e-6)
    assert fit.fixed_bytes == pytest.approx(fixed, abs=2)
    for b, peak in zip(SIZES, peaks, strict=True):
        assert fit.bytes_at(b) >= peak - 2  # never under a measured point
        assert fit.bytes_at(b) == pytest.approx(peak, rel=1e-6)
    assert fit.bytes_at(32) == pytest.approx(fixed + 32 * per, rel=1e-9)


def test_a_curve_that_never_leaves_the_plateau_has_no_measured_slope() -> None:
    fit = fit_curve(SIZES, [10 * MIB] * 5)
    assert not fit.measured
    assert fit.plateau_bytes == 10 * MIB
    assert fit.bytes_at(64) == 10 * MIB


def test_fit_rejects_mismatched_points() -> None:
    with pytest.raises(ValueError, match="as many peaks"):
        fit_curve([1, 2], [1])


# A user model the analytic transformer formulas know nothing about: hidden 1, vocab 0 (what shape
# introspection returns for a CNN). Its activations must come from the curves alone.
CNN = model_shape(family="vision", parameters=2_000_000, largest_layer_parameters=300_000, layers=6,
                  hidden=1, heads=1, ffn_hidden=4, vocab=0, tokens_per_sample=1024, small_parameters=20_000)
BARE = dict(fixed=1 * MIB, per=13 * MIB, plateau=9 * MIB)  # 13 MB/sample, the CNN slope
HELD = dict(fixed=0.5 * MIB, per=13 * MIB, plateau=0.0)


def _profile(*, optimizer: str = "adamw", step_bytes: int | None = None) -> Profile:
    curves = [
        ActivationCurve(precision=Precision.FP32, checkpointing=Checkpointing.NONE, gradients_held=held,
                        micro_batch_sizes=SIZES, peak_bytes=_law(**law))
        for held, law in ((False, BARE), (True, HELD))
    ]
    measurements = []
    if step_bytes is not None:
        measurements.append(Measurement(precision=Precision.FP32, checkpointing=Checkpointing.NONE,
                                        micro_batch_size=1, peak_allocated_bytes=step_bytes,
                                        peak_step_bytes=step_bytes, peak_backward_bytes=step_bytes - 1,
                                        step_seconds=0.1))
    return Profile(problem_hash="x", device="cpu", shape=CNN, measurements=measurements,
                   activation_curves=curves, optimizer=optimizer)


def _strategy(*, optimizer: OptimizerKind = OptimizerKind.ADAMW, world_size: int = 1, gpus_per_node: int = 1,
              **config: object) -> Strategy:
    """A CPU DDP fp32 strategy at micro-batch 8; `config` overrides TrainingConfig fields."""
    fields: dict[str, object] = dict(engine=Engine.DDP, zero_stage=0, precision=Precision.FP32,
                                     activation_checkpointing=Checkpointing.NONE, offload=Offload.NONE,
                                     optimizer8bit=False, micro_batch_size=8, gradient_accumulation_steps=1)
    fields.update(config)
    return Strategy(config=TrainingConfig.model_validate(fields), optimizer=optimizer, world_size=world_size,
                    gpus_per_node=gpus_per_node, device=Device.CPU)


def test_world_size_one_follows_the_bare_curve_above_the_static_bytes() -> None:
    shape = Shape.of(CNN)
    calibration = calibrate(_profile(), shape)
    for b in (1, 4, 8, 32):
        strategy = _strategy(micro_batch_size=b)
        analytic = memory_terms(shape, strategy)
        calibrated = memory_terms(shape, strategy, calibration=calibration)
        expected_activation = max(BARE["plateau"], BARE["fixed"] + BARE["per"] * b)
        step = analytic.step_gradient_bytes + analytic.step_temporary_bytes
        assert calibrated.allocated_bytes(b, 1) == pytest.approx(
            analytic.static_bytes + max(expected_activation, step, analytic.backward_end_bytes), rel=1e-9)
    assert calibration.sources(_strategy())["activations"] == "measured"


def test_world_size_two_uses_the_held_curve_on_top_of_the_gradient_buckets() -> None:
    shape = Shape.of(CNN)
    calibration = calibrate(_profile(), shape)
    estimate = predict_memory(shape, _strategy(world_size=2, gpus_per_node=2, micro_batch_size=16),
                              calibration=calibration)
    buckets = 4 * CNN.parameters  # gradient_as_bucket_view: the buckets are the gradients
    static = 4 * CNN.parameters + 8 * CNN.parameters + buckets
    assert estimate.allocated_bytes == pytest.approx(static + HELD["fixed"] + 16 * HELD["per"], abs=2)


def test_accumulation_at_world_size_one_adds_the_held_gradients() -> None:
    shape = Shape.of(CNN)
    calibration = calibrate(_profile(), shape)
    one = memory_terms(shape, _strategy(), calibration=calibration)
    assert one.allocated_bytes(16, 4) - one.allocated_bytes(16, 1) == pytest.approx(
        (4 * CNN.parameters + HELD["fixed"] + 16 * HELD["per"]) - (BARE["fixed"] + 16 * BARE["per"]), abs=2)


def test_without_curves_a_user_model_gets_analytic_activations_and_says_so() -> None:
    shape = Shape.of(CNN)
    calibration = calibrate(Profile(problem_hash="x", device="cpu", shape=CNN), shape)
    assert calibration.sources(_strategy())["activations"] == "analytic"
    assert predict_memory(shape, _strategy(), calibration=calibration).activations_bytes < 1 * MIB


def test_a_step_residual_measured_with_adamw_is_not_applied_to_sgd() -> None:
    shape = Shape.of(CNN)
    adam = _strategy(micro_batch_size=1)
    analytic_step = memory_terms(shape, adam)
    measured_step = round(analytic_step.static_bytes + analytic_step.step_gradient_bytes
                          + analytic_step.step_temporary_bytes + 5 * MIB)
    calibration = calibrate(_profile(step_bytes=measured_step), shape)
    assert calibration.optimizer == OptimizerKind.ADAMW
    assert calibration.step_residual(adam) == pytest.approx(5 * MIB, abs=2)
    sgd = _strategy(micro_batch_size=1, optimizer=OptimizerKind.SGD)
    assert calibration.step_residual(sgd) == 0.0
    assert calibration.sources(sgd)["step"] == "analytic"
    assert calibration.sources(adam)["step"] == "measured"


def test_other_engines_take_the_measured_per_sample_bytes() -> None:
    shape = Shape.of(CNN)
    calibration = calibrate(_profile(), shape)
    zero2 = _strategy(engine=Engine.DEEPSPEED, zero_stage=2, precision=Precision.FP32)
    terms = memory_terms(shape, zero2, calibration=calibration)
    assert terms.activation_bytes_per_sample == pytest.approx(HELD["per"])
    assert terms.block_activation_bytes_per_sample == pytest.approx(HELD["per"])
