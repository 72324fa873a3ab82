"""Time model calibration from measured step times of finished runs, like for like.

A finished attempt on a real GPU reports its measured seconds per optimizer step next to the step time
its plan's model predicted before any learned factor, and that prediction's compute part
(lifecycle.learning; `Plan.model_step_seconds`). The measured step less the predicted communication and
offload, over the predicted compute, per (GPU product, precision, engine) -- the median
over runs, so one noisy run does not swing it -- scales the compute time of later plans with that same
GPU product, precision and engine: a bf16 DeepSpeed run that was 1.5x slower than predicted on L4s makes
later bf16 DeepSpeed plans on L4s 1.5x slower in compute. An L4 says nothing about an A10G. On the same
GPU, an engine not measured yet at a measured precision takes the median of the measured engines there,
and a precision not measured at all takes only a slowdown (timing.step.GpuSpeed.learned_factor): a
configuration nobody ran is never planned faster than the model says, so learning that bf16 is slow does
not make an unmeasured fp32 look attractive. Communication and offload transfer are left as modelled
(the ratio is mostly compute efficiency, the term the model estimates).

CPU runs and the test bed's simulated GPU are never learned (lifecycle.learning stores no GPU step time
for them). The factor is bounded to [1/4, 4], and the learned compute is never faster than the GPU's
peak (timing.step): a ratio beyond that is a broken measurement, not a calibration; the offer's note
says when a bound applied.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from memfit.api.common import Engine, Precision
from memfit.planner.offers import Offer
from memfit.timing.step import MAX_LEARNED_FACTOR, MIN_LEARNED_FACTOR

SpeedKey = tuple[str, Precision, Engine]
LEARNED_PREFIX = "learned on "  # (GPU product lower-case, precision, engine)


@dataclass(frozen=True, slots=True)
class MeasuredStepTime:
    """One finished run on a GPU: its measured and its predicted seconds per optimizer step, and the
    precision and engine it ran with."""

    gpu_product: str
    measured_seconds: float
    predicted_seconds: float
    precision: Precision = Precision.BF16
    engine: Engine = Engine.DDP
    # The predicted step's compute part, before any learned factor (None: a record from before memfit
    # kept it; the whole step's ratio is used then).
    predicted_compute_seconds: float | None = None

    def ratio(self) -> float:
        """Measured / predicted compute: the measured step less the predicted communication and offload,
        over the predicted compute (both predictions without learned factors, so what was learned
        before does not feed back)."""
        compute = self.predicted_compute_seconds
        if compute is None or not 0 < compute <= self.predicted_seconds:
            return self.measured_seconds / self.predicted_seconds
        other = self.predicted_seconds - compute
        return max(0.0, self.measured_seconds - other) / compute


@dataclass(frozen=True, slots=True)
class LearnedSpeed:
    """What the measured runs of one (product, precision, engine) taught: the bounded factor, the raw
    median it came from, and how many runs."""

    factor: float
    median: float
    runs: int

    @property
    def bounded(self) -> bool:
        return self.factor != self.median


def step_time_factors(measured: Sequence[MeasuredStepTime]) -> dict[SpeedKey, LearnedSpeed]:
    """(product, precision, engine) -> median measured / predicted step seconds, bounded."""
    ratios: dict[SpeedKey, list[float]] = {}
    for m in measured:
        ok = math.isfinite(m.measured_seconds) and math.isfinite(m.predicted_seconds)
        if ok and m.measured_seconds > 0 and m.predicted_seconds > 0:
            key = (m.gpu_product.lower(), m.precision, m.engine)
            ratios.setdefault(key, []).append(m.ratio())
    out: dict[SpeedKey, LearnedSpeed] = {}
    for key, values in ratios.items():
        median = statistics.median(values)
        out[key] = LearnedSpeed(min(MAX_LEARNED_FACTOR, max(MIN_LEARNED_FACTOR, median)), median, len(values))
    return out


def with_measured_speed(offer: Offer, factors: Mapping[SpeedKey, LearnedSpeed]) -> Offer:
    """The offer with the compute factors learned on its GPU product, per precision and engine."""
    product = offer.product.lower()
    mine = sorted(((p, e, learned) for (prod, p, e), learned in factors.items() if prod == product),
                  key=lambda item: (item[0].value, item[1].value))
    if not mine:
        return offer
    speed = replace(offer.speed, learned=tuple((p, e, learned.factor) for p, e, learned in mine))
    notes = [_note(offer.product, p, e, learned) for p, e, learned in mine]
    return replace(offer, speed=speed, notes=(*offer.notes, *notes))


def learned_speed_notes(offer: Offer | None) -> list[str]:
    """What the plan's pool learned from measured step times (shown in the status and `memfit plan`)."""
    return [n for n in (offer.notes if offer is not None else ()) if n.startswith(LEARNED_PREFIX)]


def _note(product: str, precision: Precision, engine: Engine, learned: LearnedSpeed) -> str:
    runs = f"{learned.runs} run{'s' if learned.runs != 1 else ''}"
    note = (f"{LEARNED_PREFIX}{product}, {precision.value} {engine.value}: measured step times were "
            f"{learned.median:.2f}x the predicted ones ({runs}), so compute is planned x {learned.factor:.2f}")
    if learned.bounded:
        note += f" (bounded to [{MIN_LEARNED_FACTOR:g}, {MAX_LEARNED_FACTOR:g}]: beyond is a broken measurement)"
    return note
