"""Depth-reduced profiles: calibrate at each measured depth, then scale the per-block terms to L blocks.

A large model is profiled as the same architecture with 1 and 2 of its L repeated blocks
(`Profile.depth`). Each depth is calibrated on its own, against the analytic model of that reduced
model (the same Shape with `layers = d` and the parameters counted on it). Every fitted quantity is
then a line in the number of blocks d, `fixed + d x per_block`, which the two depths determine and
which is read at d = L:

- activation scales: the measured per-sample bytes (scale x analytic slope at that depth) are
  extrapolated, and divided by the analytic slope of the full model;
- fixed and step residuals, and every coefficient of a measured activation curve (fixed, per-sample
  and plateau bytes): extrapolated as bytes;
- fragmentation: the larger of the depths' ratios (a ratio, not a per-block sum).

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


def extrapolate_map(
    per_depth: list[tuple[int, Mapping[K, float]]], layers: int, *, value: Callable[[int, K, float], float] | None = None
) -> dict[K, float]:
    """Each key's values across depths, extrapolated to `layers` (keys measured at one depth keep that value)."""
    keys = {k for _, mapping in per_depth for k in mapping}
    out: dict[K, float] = {}
    for key in keys:
        points = [(d, value(d, key, m[key]) if value else m[key]) for d, m in per_depth if key in m]
        out[key] = line_at(points, layers)
    return out


def extrapolate_curve(fits: list[tuple[int, CurveFit]], layers: int) -> CurveFit:
    """A measured activation curve at `layers` blocks: each coefficient extrapolated (never below 0)."""
    def at(get: Callable[[CurveFit], float]) -> float:
        return max(0.0, line_at([(d, get(f)) for d, f in fits], layers))

    measured = [f for _, f in fits if f.measured]
    return CurveFit(
        fixed_bytes=line_at([(d, f.fixed_bytes) for d, f in fits], layers),
        per_sample_bytes=at(lambda f: f.per_sample_bytes),
        plateau_bytes=at(lambda f: f.plateau_bytes),
        points_used=min(f.points_used for f in measured) if len(measured) == len(fits) else 0,
        points_total=min(f.points_total for _, f in fits),
        plateau_per_sample_bytes=at(lambda f: f.plateau_per_sample_bytes),
    )


def freeze(mapping: Mapping[K, float]) -> Mapping[K, float]:
    return MappingProxyType(dict(mapping))


def profile_optimizer(profile: Profile) -> OptimizerKind:
    try:
        return OptimizerKind(profile.optimizer or OptimizerKind.ADAMW.value)
    except ValueError:
        return OptimizerKind.ADAMW
