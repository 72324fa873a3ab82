"""Time model calibration from measured step times of finished runs.

A finished attempt on a GPU reports its measured seconds per optimizer step next to the step time its
plan predicted (lifecycle.learning). Their ratio, per GPU product (the median over runs, so one noisy
run does not swing it), scales the product's compute throughput for later plans: a model that ran 1.5x
slower than predicted on L4s is planned on L4s at 1/1.5 of the throughput. Communication and offload
transfer are left as modelled (the ratio is mostly compute efficiency, the term the model guesses).
CPU runs say nothing about a GPU's speed and are not used. The factor is bounded to [1/4, 4]: a ratio
beyond that is a broken measurement, not a calibration.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from memfit.planner.offers import Offer

MIN_FACTOR, MAX_FACTOR = 0.25, 4.0


@dataclass(frozen=True, slots=True)
class MeasuredStepTime:
    """One finished run on a GPU: its measured and its predicted seconds per optimizer step."""

    gpu_product: str
    measured_seconds: float
    predicted_seconds: float


def step_time_factors(measured: Sequence[MeasuredStepTime]) -> dict[str, float]:
    """GPU product -> median measured / predicted step seconds, bounded."""
    ratios: dict[str, list[float]] = {}
    for m in measured:
        if m.measured_seconds > 0 and m.predicted_seconds > 0:
            ratios.setdefault(m.gpu_product.lower(), []).append(m.measured_seconds / m.predicted_seconds)
    return {product: min(MAX_FACTOR, max(MIN_FACTOR, statistics.median(values)))
            for product, values in ratios.items()}


def with_measured_speed(offer: Offer, factors: Mapping[str, float]) -> Offer:
    """The offer with its compute throughput divided by its product's measured step-time factor."""
    factor = factors.get(offer.product.lower())
    if factor is None or factor == 1.0:
        return offer
    speed = replace(offer.speed, bf16_tflops=offer.speed.bf16_tflops / factor,
                    fp16_tflops=offer.speed.fp16_tflops / factor, fp32_tflops=offer.speed.fp32_tflops / factor)
    note = (f"compute throughput x {1 / factor:.2f}: measured step times on {offer.product} were "
            f"{factor:.2f}x the predicted ones")
    return replace(offer, speed=speed, notes=(*offer.notes, note))
