"""Measured peaks from earlier attempts (auto-downsizing and OOM re-plans), learned like for like.

A measured peak has a kind, and is compared with the part of the prediction that measures the same
bytes:

- `ALLOCATED`: allocator tensor bytes (the CPU allocator, or `torch.cuda.max_memory_allocated`) of
  the largest rank. They teach the device-invariant tensor terms: measured / predicted allocated
  bytes (before fragmentation and the CUDA/NCCL overhead) scales the tensor part of every prediction.
  A CPU-measured run teaches them as well as a GPU one. A candidate of the same family (engine,
  stage, precision, checkpointing, offload, 8-bit) is scaled by the ratio at its own world size, else
  by the family's latest; any other candidate by the largest ratio above 1 (an under-prediction makes
  every unmeasured prediction more cautious; an over-prediction never shrinks an unmeasured one).
- `RESERVED`: the CUDA caching allocator's reservation on a GPU product; compared with the predicted
  fragmentation x allocated bytes (tensor correction applied).
- `DEVICE`: what the GPU holds for the process (NVML), or after a CUDA OOM the capacity it ran into
  (a lower bound); compared with the whole predicted peak.

`RESERVED` and `DEVICE` measure the device-specific terms (allocator gap, CUDA context, NCCL), so they
apply only to the GPU product they were measured on (an OOM's bound, with no product, to every GPU),
and only upward: a measured peak above the prediction moves later runs up, never down. The planner
applies a product's factor as less usable memory on that product's pools (`device_factor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from memfit.api.training_config import ConfigKey
from memfit.memory.calibration import Calibration
from memfit.memory.predict import memory_terms
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy


class PeakKind(StrEnum):
    """Which bytes a measured peak counts."""

    ALLOCATED = "allocated"  # tensor bytes from the allocator (CPU or CUDA): device-invariant
    RESERVED = "reserved"  # CUDA caching allocator reservation: allocated + its fragmentation
    DEVICE = "device"  # NVML process memory, or an OOM's capacity bound: everything on the GPU


@dataclass(frozen=True, slots=True)
class MeasuredPeak:
    """One observed per-GPU peak of a configuration that ran (the largest rank's)."""

    strategy: Strategy
    peak_bytes: int
    kind: PeakKind = PeakKind.DEVICE
    gpu_product: str | None = None  # RESERVED/DEVICE: the GPU measured on; None = any GPU (an OOM bound)


@dataclass(frozen=True, slots=True)
class PeakCorrections:
    """Tensor ratios by family with the cautious default, and upward device factors by GPU product."""

    by_family: dict[ConfigKey, list[tuple[int, float]]]  # (world size, ratio), oldest first
    default_factor: float = 1.0
    device_factors: dict[str | None, float] = field(default_factory=dict)  # product (None: all) -> >= 1

    def factor(self, strategy: Strategy) -> float:
        """Scale of the tensor part of `strategy`'s predicted peak (its micro-batch does not matter)."""
        observed = self.by_family.get(strategy.config.key())
        if not observed:
            return self.default_factor
        same_world = [ratio for world, ratio in observed if world == strategy.world_size]
        return same_world[-1] if same_world else observed[-1][1]

    def device_factor(self, gpu_product: str) -> float:
        """Scale (>= 1) of whole predicted peaks on `gpu_product`, from its own device measurements."""
        return max(self.device_factors.get(gpu_product, 1.0), self.device_factors.get(None, 1.0))


NO_CORRECTIONS = PeakCorrections({})


def peak_corrections(
    measured: Sequence[MeasuredPeak], shape: Shape, *, calibration: Calibration | None = None,
) -> PeakCorrections:
    """Corrections from measured peaks (predictions made exactly as the planner makes them)."""
    if not measured:
        return NO_CORRECTIONS
    by_family: dict[ConfigKey, list[tuple[int, float]]] = {}
    worst = 1.0
    for m in measured:  # the tensor terms first: the device terms are compared after them
        if m.kind != PeakKind.ALLOCATED or m.peak_bytes <= 0:
            continue
        s = m.strategy
        predicted = memory_terms(shape, s, calibration=calibration).allocated_bytes(
            s.config.micro_batch_size, s.config.gradient_accumulation_steps
        )
        if predicted <= 0:
            continue
        ratio = m.peak_bytes / predicted
        by_family.setdefault(s.config.key(), []).append((s.world_size, ratio))
        worst = max(worst, ratio)
    tensors = PeakCorrections(by_family, worst)
    device: dict[str | None, float] = {}
    for m in measured:
        if m.kind == PeakKind.ALLOCATED or m.peak_bytes <= 0:
            continue
        s = m.strategy
        terms = memory_terms(shape, s, calibration=calibration).scaled(tensors.factor(s))
        b, acc = s.config.micro_batch_size, s.config.gradient_accumulation_steps
        if m.kind == PeakKind.RESERVED:
            predicted = terms.fragmentation * terms.allocated_bytes(b, acc) * terms.scale
        else:
            predicted = terms.peak_bytes(b, acc)
        if predicted > 0 and m.peak_bytes > predicted:
            key = m.gpu_product
            device[key] = max(device.get(key, 1.0), m.peak_bytes / predicted)
    return PeakCorrections(by_family, worst, device)
