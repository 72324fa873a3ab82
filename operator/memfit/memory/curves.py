"""Measured activation terms: fit a Profile's activation curves into fixed and per-sample bytes.

A curve is the forward+backward peak above the bytes allocated at the step's start, measured at
micro-batches 1, 2, 4, ... on the model as the trainer runs it (memfit_trainer.profiler.measure).
Whatever the model is (convolutions, recurrent layers, routers, custom autograd functions), that
peak is the larger of two things:

- a line `fixed + per_sample x b`, once the activations (and the transients around the loss and
  the recompute) dominate: every per-sample byte grows with b;
- a plateau that grows slowly or not at all with b: the moment backward has created (nearly) every
  gradient, which is the peak at small micro-batches when activations are small. It is kept as a
  second line (`plateau_bytes + plateau_per_sample_bytes x b`) lying on or above every point below
  the main line, so that micro-batches between measured ones are not under-predicted.

`fit_curve` finds the line on the points where the peak grows (the largest micro-batches, where
the line is the peak), and the plateau on the others; nothing here assumes a transformer. A curve
whose points never leave the plateau has no measured slope: the caller falls back to another curve
or to the analytic model, and says so (`CurveFit.source`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Points within this share of the line through the largest micro-batches lie on it (allocator
# peaks are byte-exact on a CPU; 0.5 % absorbs a few KB of kernel scratch).
ON_LINE = 0.005
# A rise smaller than this share of the peak between the two largest micro-batches is a plateau.
FLAT = 0.002


@dataclass(frozen=True, slots=True)
class CurveFit:
    """peak(b) = max(plateau line, fixed_bytes + per_sample_bytes x b), bytes above the step's start."""

    fixed_bytes: float
    per_sample_bytes: float
    plateau_bytes: float
    points_used: int  # points on the line
    points_total: int
    plateau_per_sample_bytes: float = 0.0

    @property
    def measured(self) -> bool:
        """The line rests on at least two micro-batches."""
        return self.points_used >= 2 and self.per_sample_bytes > 0

    def bytes_at(self, micro_batch: int) -> float:
        """Fitted peak above the step's start at `micro_batch`."""
        return max(self.plateau_bytes + self.plateau_per_sample_bytes * micro_batch,
                   self.fixed_bytes + self.per_sample_bytes * micro_batch)


def least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b x."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
    return mean_y - slope * mean_x, slope


def fit_curve(micro_batches: Sequence[int], peak_bytes: Sequence[int]) -> CurveFit:
    """Line through the growing tail of the curve, plateau from the points below it.

    Raises ValueError for fewer than one point or mismatched lengths.
    """
    if len(micro_batches) != len(peak_bytes) or not micro_batches:
        raise ValueError("a curve needs as many peaks as micro-batches, at least one")
    points = sorted((float(b), float(y)) for b, y in zip(micro_batches, peak_bytes, strict=True))
    # Repeated micro-batches: keep the largest peak of each.
    merged: dict[float, float] = {}
    for b, y in points:
        merged[b] = max(y, merged.get(b, y))
    points = sorted(merged.items())
    if len(points) < 2:
        b, y = points[0]
        return CurveFit(0.0, 0.0, y, 0, 1)
    (b1, y1), (b2, y2) = points[-2], points[-1]
    slope = (y2 - y1) / (b2 - b1)
    if slope <= 0 or (y2 - y1) <= FLAT * y2:
        return CurveFit(0.0, 0.0, max(y for _, y in points), 0, len(points))
    used = [points[-2], points[-1]]
    intercept = y2 - slope * b2
    for b, y in reversed(points[:-2]):
        if abs(y - (intercept + slope * b)) > ON_LINE * max(y, 1.0):
            break
        used.insert(0, (b, y))
        intercept, slope = least_squares(used)
    below = points[: len(points) - len(used)]
    plateau, plateau_slope = 0.0, 0.0
    if len(below) >= 2:
        _, plateau_slope = least_squares(below)
        plateau_slope = max(0.0, plateau_slope)
    if below:
        # Raised until it lies on or above every point below the line (an upper envelope).
        plateau = max(y - plateau_slope * b for b, y in below)
    return CurveFit(intercept, slope, plateau, len(used), len(points), plateau_slope)
