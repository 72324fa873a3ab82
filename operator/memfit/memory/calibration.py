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
- A group with a single micro-batch cannot separate the two: its whole error goes to the slope.
- Where `peak_reserved_bytes` is present (CUDA profiles), the median reserved/allocated ratio
  replaces the default fragmentation factor.

Groups without a measurement borrow the nearest measured group: same checkpointing, then same
precision, then the mean of all groups; the residual only from the same precision.
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
MIN_ACTIVATION_SCALE, MAX_ACTIVATION_SCALE = 0.25, 4.0
MIN_FRAGMENTATION, MAX_FRAGMENTATION = 1.0, 2.0

GroupKey = tuple[Precision, Checkpointing]


def _empty() -> Mapping[GroupKey, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Calibration:
    """Fitted corrections; an empty Calibration changes nothing (except fragmentation if set)."""

    activation_scales: Mapping[GroupKey, float] = field(default_factory=_empty)
    fixed_residuals: Mapping[GroupKey, float] = field(default_factory=_empty)
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
                return statistics.fmean(matches)
        return statistics.fmean(scales.values())

    def fixed_residual(self, precision: Precision, checkpointing: Checkpointing) -> float:
        """Unmodelled fixed bytes for this precision (0 when not measured)."""
        exact = self.fixed_residuals.get((precision, checkpointing))
        if exact is not None:
            return exact
        same = [v for (p, _), v in self.fixed_residuals.items() if p == precision]
        return statistics.fmean(same) if same else 0.0


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
    """Fit activation scales, fixed residuals and fragmentation from `profile.measurements`."""
    groups: dict[GroupKey, list[tuple[float, float, float]]] = {}
    notes: list[str] = []
    ratios: list[float] = []
    for m in profile.measurements:
        if m.precision == Precision.AUTO or m.checkpointing == Checkpointing.AUTO:
            notes.append("skipped a measurement with precision or checkpointing auto")
            continue
        strategy = _profile_strategy(m, optimizer)
        states = model_states(shape, strategy)
        temps = fixed_temporaries(shape, strategy)
        acts = activation_terms(shape, strategy)
        slope = acts.activation_bytes_per_sample + acts.temporary_bytes_per_sample
        # Analytic intercept of the activation-dominated backward phase, excluding the optimizer
        # state (it differs between the 8-bit and 32-bit points of one group).
        fixed = states.parameters_bytes + temps.backward_bytes + min(temps.first_gradient_bytes,
                                                                      states.gradients_bytes)
        target = m.peak_allocated_bytes - states.optimizer_bytes
        groups.setdefault((m.precision, m.checkpointing), []).append(
            (float(m.micro_batch_size), target - fixed, slope)
        )
        if m.peak_reserved_bytes and m.peak_allocated_bytes:
            ratios.append(m.peak_reserved_bytes / m.peak_allocated_bytes)
    scales: dict[GroupKey, float] = {}
    residuals: dict[GroupKey, float] = {}
    for key, points in sorted(groups.items()):
        analytic_slope = statistics.fmean(s for _, _, s in points)
        if analytic_slope <= 0:
            continue
        if len({b for b, _, _ in points}) >= 2:
            intercept, slope = _least_squares([(b, y) for b, y, _ in points])
            residuals[key] = intercept
        else:
            slope = statistics.fmean(y / b for b, y, _ in points)
            notes.append(f"{key[0].value}/{key[1].value}: one micro-batch size, error assigned to activations")
        scales[key] = min(MAX_ACTIVATION_SCALE, max(MIN_ACTIVATION_SCALE, slope / analytic_slope))
    fragmentation = None
    if ratios:
        fragmentation = min(MAX_FRAGMENTATION, max(MIN_FRAGMENTATION, statistics.median(ratios)))
    return Calibration(
        activation_scales=MappingProxyType(scales),
        fixed_residuals=MappingProxyType(residuals),
        fragmentation=fragmentation,
        notes=tuple(notes),
    )
