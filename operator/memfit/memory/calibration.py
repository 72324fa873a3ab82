"""Calibration of the analytic model from a Profile's measured points.

The profiler runs the model on one device (single process, no sharding) at a few configurations,
each with at least two micro-batch sizes. For one (precision, checkpointing) group the measured peak
allocated bytes are, in the model, `intercept + slope x micro_batch` (activations dominate the peak):

- slope = activation + backward-temporary bytes per sample, fitted by least squares over the group's
  points (two micro-batches are enough). `activation_scale = measured slope / analytic slope` then
  multiplies the per-sample terms of every strategy with that precision and checkpointing, at any
  engine, world size and micro-batch (activations do not shard under data parallelism).
- intercept - analytic (parameters + optimizer + temporaries + first gradients) = `fixed_residual`:
  bytes the analytic model does not know about (autocast caches, library buffers). It is added to
  the fixed temporaries (never taking them below zero).
- A group with a single micro-batch cannot separate the two: its whole error goes to the fixed
  residual (the activation formulas are the better-checked part). Points of one group are fitted
  separately for 32-bit and 8-bit optimizer state, then averaged.
- A point whose analytic peak is the optimizer step measures the step's unmodelled bytes instead:
  `step_residual` per precision, added to the step temporaries.
- Where `peak_reserved_bytes` is present (CUDA profiles), the median reserved/allocated ratio
  replaces the default fragmentation factor.

Groups without a measurement borrow the nearest measured group: same checkpointing, then same
precision, then the mean of all groups; the residual only from the same precision. Borrowed
corrections only ever raise a prediction (scale >= 1, residual >= 0): a measurement of one
configuration must not make an unmeasured one look smaller than the model says.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import OptimizerKind
from memfit.api.profile import Measurement, Profile
from memfit.memory.activations import activation_terms
from memfit.memory.shape import Shape
from memfit.memory.states import model_states
from memfit.memory.strategy import Strategy
from memfit.memory.temporaries import fixed_temporaries

# Bounds on the fitted factors: outside them the profile is more likely wrong than the model.
MIN_ACTIVATION_SCALE, MAX_ACTIVATION_SCALE = 0.5, 2.0
MIN_FRAGMENTATION, MAX_FRAGMENTATION = 1.0, 2.0

GroupKey = tuple[Precision, Checkpointing]


def _empty() -> Mapping[GroupKey, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Calibration:
    """Fitted corrections; an empty Calibration changes nothing (except fragmentation if set)."""

    activation_scales: Mapping[GroupKey, float] = field(default_factory=_empty)
    fixed_residuals: Mapping[GroupKey, float] = field(default_factory=_empty)
    step_residuals: Mapping[Precision, float] = field(default_factory=lambda: MappingProxyType({}))
    fragmentation: float | None = None
    notes: tuple[str, ...] = ()

    def activation_scale(self, precision: Precision, checkpointing: Checkpointing) -> float:
        """Factor on the per-sample terms of this precision and checkpointing."""
        scales = self.activation_scales
        if not scales:
            return 1.0
        exact = scales.get((precision, checkpointing))
        if exact is not None:
            return exact
        for matches in (
            [v for (_, c), v in scales.items() if c == checkpointing],
            [v for (p, _), v in scales.items() if p == precision],
        ):
            if matches:
                return max(1.0, statistics.fmean(matches))
        return max(1.0, statistics.fmean(scales.values()))

    def step_residual(self, precision: Precision) -> float:
        """Unmodelled bytes of the optimizer step (measured where the step was the peak)."""
        exact = self.step_residuals.get(precision)
        if exact is not None:
            return exact
        return max(0.0, statistics.fmean(self.step_residuals.values())) if self.step_residuals else 0.0

    def fixed_residual(self, precision: Precision, checkpointing: Checkpointing) -> float:
        """Unmodelled fixed bytes for this precision (0 when not measured)."""
        exact = self.fixed_residuals.get((precision, checkpointing))
        if exact is not None:
            return exact
        same = [v for (p, _), v in self.fixed_residuals.items() if p == precision]
        return max(0.0, statistics.fmean(same)) if same else 0.0


def _profile_strategy(m: Measurement, optimizer: OptimizerKind) -> Strategy:
    return Strategy(
        engine=Engine.DDP, zero_stage=0, precision=m.precision, checkpointing=m.checkpointing,
        offload=Offload.NONE, optimizer8bit=m.optimizer8bit, optimizer=optimizer,
        micro_batch_size=m.micro_batch_size,
    )


def _least_squares(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b x."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
    return mean_y - slope * mean_x, slope


def calibrate(profile: Profile, shape: Shape, *, optimizer: OptimizerKind = OptimizerKind.ADAMW) -> Calibration:
    """Fit activation scales, fixed and step residuals and fragmentation from `profile.measurements`."""
    # (precision, checkpointing, 8-bit) -> [(micro-batch, measured - analytic fixed, analytic slope)]
    groups: dict[tuple[Precision, Checkpointing, bool], list[tuple[float, float, float]]] = {}
    step_errors: dict[Precision, list[float]] = {}
    notes: list[str] = []
    ratios: list[float] = []
    for m in profile.measurements:
        if m.precision == Precision.AUTO or m.checkpointing == Checkpointing.AUTO:
            notes.append("skipped a measurement with precision or checkpointing auto")
            continue
        if m.peak_reserved_bytes and m.peak_allocated_bytes:
            ratios.append(m.peak_reserved_bytes / m.peak_allocated_bytes)
        strategy = _profile_strategy(m, optimizer)
        states = model_states(shape, strategy)
        temps = fixed_temporaries(shape, strategy)
        acts = activation_terms(shape, strategy)
        slope = acts.activation_bytes_per_sample + acts.temporary_bytes_per_sample
        first = min(temps.first_gradient_bytes, states.gradients_bytes)
        static = states.parameters_bytes + states.optimizer_bytes
        backward = static + temps.backward_bytes + max(m.micro_batch_size * slope + first, states.gradients_bytes)
        step = static + states.gradients_bytes + temps.step_bytes
        if step >= backward:
            # The peak is the optimizer step: it measures the step's extra bytes, not activations.
            step_errors.setdefault(m.precision, []).append(m.peak_allocated_bytes - step)
            notes.append(f"{m.precision.value}/{m.checkpointing.value} micro-batch {m.micro_batch_size}: "
                         "peak in the optimizer step, used for the step residual only")
            continue
        fixed = static + temps.backward_bytes + first
        groups.setdefault((m.precision, m.checkpointing, m.optimizer8bit), []).append(
            (float(m.micro_batch_size), m.peak_allocated_bytes - fixed, slope)
        )
    fitted_scales: dict[GroupKey, list[float]] = {}
    fitted_residuals: dict[GroupKey, list[float]] = {}
    for (precision, ckpt, eight), points in sorted(groups.items()):
        key: GroupKey = (precision, ckpt)
        analytic_slope = statistics.fmean(s for _, _, s in points)
        if len({b for b, _, _ in points}) >= 2 and analytic_slope > 0:
            _, slope = _least_squares([(b, y) for b, y, _ in points])
            scale = min(MAX_ACTIVATION_SCALE, max(MIN_ACTIVATION_SCALE, slope / analytic_slope))
            fitted_scales.setdefault(key, []).append(scale)
            fitted_residuals.setdefault(key, []).append(
                statistics.fmean(y - b * scale * s for b, y, s in points)
            )
        else:
            # One micro-batch cannot separate slope from intercept; activations are the better-known
            # term (checked against saved tensors), so the error goes to the fixed residual.
            fitted_residuals.setdefault(key, []).append(statistics.fmean(y - b * s for b, y, s in points))
            notes.append(f"{precision.value}/{ckpt.value}{' 8-bit' if eight else ''}: one micro-batch size, "
                         "error assigned to the fixed residual")
    fragmentation = None
    if ratios:
        fragmentation = min(MAX_FRAGMENTATION, max(MIN_FRAGMENTATION, statistics.median(ratios)))
    return Calibration(
        activation_scales=MappingProxyType({k: statistics.fmean(v) for k, v in fitted_scales.items()}),
        fixed_residuals=MappingProxyType({k: statistics.fmean(v) for k, v in fitted_residuals.items()}),
        step_residuals=MappingProxyType({k: statistics.fmean(v) for k, v in step_errors.items()}),
        fragmentation=fragmentation,
        notes=tuple(notes),
    )
