"""Depth-reduced profiles: calibrate at each measured depth, then scale the per-block terms to L blocks.

A large model is profiled as the same architecture with 1 and 2 of its L repeated blocks
(`Profile.depth`). Each depth is calibrated on its own, against the analytic model of that reduced
model (the same Shape with `layers = d` and the parameters counted on it). Every fitted quantity is
then a line in the number of blocks d, `fixed + d x per_block`, which the two depths determine and
which is read at d = L:

- activation scales: the error of the analytic per-sample bytes ((scale - 1) x analytic slope at that
  depth) is extrapolated, added to the full model's analytic slope and turned back into a scale;
- fixed and step residuals, and every coefficient of a measured activation curve (fixed, per-sample
  and plateau bytes): extrapolated as bytes;
- fragmentation: the larger of the depths' ratios (a ratio, not a per-block sum).

A difference between the two depths is a per-block term only when it is larger than measurement
noise: `NOISE_SHARE` of the deepest measured peak, the share under which calibration itself leaves
a group alone (calibration.AGREEMENT). Below it the deeper depth's value is kept as it is. Without
this rule a one-block model's own quirks (its first block is also its last, so the three moments of
backward coincide) were multiplied by L: a 0.5 MiB disagreement at one block became a +17 % over-
prediction of a 12-block decoder with full checkpointing (the accuracy benchmark's depth section).
The bound on what the rule can miss: a real per-block term below the noise adds at most that share
of the 2-block peak per block, a share of the full model's peak of the same order.

The parameter, gradient and optimizer-state terms need no extrapolation: the full model's parameters
were counted on the meta device and the analytic model computes them for L blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TypeVar

from memfit.api.job import OptimizerKind
from memfit.api.profile import Profile, ReducedDepth
from memfit.memory.curves import CurveFit
from memfit.memory.shape import Shape

K = TypeVar("K")

# Extrapolated activation scales stay within the bounds a single-depth fit is held to
# (calibration.MIN/MAX_ACTIVATION_SCALE), so a noisy per-block difference cannot run away at large L.
MIN_SCALE, MAX_SCALE = 0.5, 2.0
# Differences between depths below this share of the deepest measured peak are noise (see above).
NOISE_SHARE = 0.02


def reduced_shape(shape: Shape, reduced: ReducedDepth) -> Shape:
    """The full model's Shape with only `reduced.blocks` blocks and the parameters counted on that model."""
    trainable = reduced.parameters if reduced.trainable_parameters is None else reduced.trainable_parameters
    return replace(
        shape,
        layers=reduced.blocks,
        parameters=reduced.parameters,
        trainable=trainable,
        small_trainable=min(reduced.small_parameters, trainable),
        buffer_bytes=reduced.buffer_bytes,
        root_parameters=max(0, reduced.parameters - reduced.blocks * shape.block_parameters),
    )


def at_depth(profile: Profile, blocks: int) -> Profile:
    """The part of a depth-reduced profile measured with `blocks` blocks, as a plain profile."""
    return profile.model_copy(update={
        "measurements": [m for m in profile.measurements if m.blocks == blocks],
        "activation_curves": [c for c in profile.activation_curves if c.blocks == blocks],
        "depth": None,
    })


def line_at(points: list[tuple[int, float]], layers: int) -> float:
    """The line through (blocks, value) points read at `layers` (least squares beyond two points)."""
    if len(points) == 1:
        return points[0][1]
    n = len(points)
    mx = sum(d for d, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((d - mx) ** 2 for d, _ in points)
    slope = sum((d - mx) * (v - my) for d, v in points) / var
    return my + slope * (layers - mx)


def line_or_level(points: list[tuple[int, float]], layers: int, *, noise_bytes: float, weight: float = 1.0) -> float:
    """`line_at`, unless the values differ between the depths by no more than the noise (`weight` turns
    a per-sample value into bytes): then the deepest depth's value."""
    ordered = sorted(points)
    if len(ordered) >= 2 and abs(ordered[-1][1] - ordered[0][1]) * weight <= noise_bytes:
        return ordered[-1][1]
    return line_at(ordered, layers)


def extrapolate_map(
    per_depth: list[tuple[int, Mapping[K, float]]], layers: int, *, noise_bytes: float, weight: float = 1.0,
    value: Callable[[int, K, float], float] | None = None,
) -> dict[K, float]:
    """Each key's values across depths, extrapolated to `layers` (keys measured at one depth keep that value)."""
    keys = {k for _, mapping in per_depth for k in mapping}
    out: dict[K, float] = {}
    for key in keys:
        points = [(d, value(d, key, m[key]) if value else m[key]) for d, m in per_depth if key in m]
        out[key] = line_or_level(points, layers, noise_bytes=noise_bytes, weight=weight)
    return out


def extrapolate_curve(fits: list[tuple[int, CurveFit]], layers: int, *, noise_bytes: float = 0.0,
                      micro_batch: float = 1.0) -> CurveFit:
    """A measured activation curve at `layers` blocks: each coefficient extrapolated (never below 0);
    `micro_batch` (the largest measured) weighs per-sample differences against the noise."""
    def at(get: Callable[[CurveFit], float], weight: float = 1.0) -> float:
        return line_or_level([(d, get(f)) for d, f in fits], layers, noise_bytes=noise_bytes, weight=weight)

    measured = [f for _, f in fits if f.measured]
    return CurveFit(
        fixed_bytes=at(lambda f: f.fixed_bytes),
        per_sample_bytes=max(0.0, at(lambda f: f.per_sample_bytes, micro_batch)),
        plateau_bytes=max(0.0, at(lambda f: f.plateau_bytes)),
        points_used=min(f.points_used for f in measured) if len(measured) == len(fits) else 0,
        points_total=min(f.points_total for _, f in fits),
        plateau_per_sample_bytes=max(0.0, at(lambda f: f.plateau_per_sample_bytes, micro_batch)),
    )


def noise_bytes(profile: Profile) -> float:
    """`NOISE_SHARE` of the largest peak measured at the deepest profiled depth."""
    deepest = max((m.blocks or 0 for m in profile.measurements), default=0)
    peaks = [m.peak_allocated_bytes for m in profile.measurements if (m.blocks or 0) == deepest]
    peaks += [p for c in profile.activation_curves if (c.blocks or 0) >= deepest for p in c.peak_bytes]
    return NOISE_SHARE * max(peaks, default=0)


def freeze(mapping: Mapping[K, float]) -> Mapping[K, float]:
    return MappingProxyType(dict(mapping))


def profile_optimizer(profile: Profile) -> OptimizerKind:
    try:
        return OptimizerKind(profile.optimizer or OptimizerKind.ADAMW.value)
    except ValueError:
        return OptimizerKind.ADAMW
