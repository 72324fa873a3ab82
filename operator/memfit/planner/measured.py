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
- `DEVICE`: what the GPU held, compared with the whole predicted peak: after a CUDA OOM the capacity
  it ran into (a lower bound, on every GPU: the failed run does not say which term was short).

A GPU run also reports its device-specific terms, `MeasuredDevice`: the caching allocator's reservation
next to its allocated bytes (the allocator gap) and NVML's process bytes next to the reservation (CUDA
context, cuBLAS, NCCL). They apply only to the GPU product they were measured on: a larger gap raises
or lowers that product's fragmentation factor (the largest gap measured on it counts); a context larger
or smaller than the default shifts its fixed overhead (smaller only from 1-GPU runs, whose overhead
has no NCCL part). A measured peak above the prediction moves later runs up, never down.
The planner applies a product's terms to its pools as a smaller or larger memory budget (`DeviceTerms`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from memfit.api.training_config import ConfigKey
from memfit.memory.calibration import Calibration
from memfit.memory.overhead import framework_overhead
from memfit.memory.predict import memory_terms
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy


class PeakKind(StrEnum):
    """Which bytes a measured peak counts."""

    ALLOCATED = "allocated"  # tensor bytes from the allocator (CPU or CUDA): device-invariant
    DEVICE = "device"  # an OOM's capacity bound: everything on the GPU


@dataclass(frozen=True, slots=True)
class MeasuredPeak:
    """One observed per-GPU peak of a configuration that ran (the largest rank's)."""

    strategy: Strategy
    peak_bytes: int
    kind: PeakKind = PeakKind.DEVICE
    gpu_product: str | None = None  # DEVICE: the GPU measured on; None = any GPU (an OOM bound)


@dataclass(frozen=True, slots=True)
class MeasuredDevice:
    """A GPU run's device-side figures, all from its largest rank: allocator tensor bytes, the caching
    allocator's reservation and (when known) the process's NVML bytes."""

    gpu_product: str
    world_size: int
    allocated_bytes: int
    reserved_bytes: int
    device_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceTerms:
    """A GPU product's measured device-side correction: predicted peak x factor + offset bytes."""

    factor: float = 1.0
    offset_bytes: float = 0.0

    def budget(self, usable_bytes: int, *, headroom_percent: int) -> int:
        """The memory budget for an uncorrected prediction: peak x factor + offset fits `usable_bytes`
        with headroom iff peak fits the budget with headroom."""
        return int((usable_bytes - self.offset_bytes * (1 + headroom_percent / 100)) / self.factor)


@dataclass(frozen=True, slots=True)
class PeakCorrections:
    """Tensor ratios by family with the cautious default, and upward device factors by GPU product."""

    by_family: dict[ConfigKey, list[tuple[int, float]]]  # (world size, ratio), oldest first
    default_factor: float = 1.0
    device_factors: dict[str | None, float] = field(default_factory=dict)  # product (None: OOM, all GPUs)
    device_offsets: dict[str, float] = field(default_factory=dict)  # product -> fixed-overhead shift, bytes

    def factor(self, strategy: Strategy) -> float:
        """Scale of the tensor part of `strategy`'s predicted peak (its micro-batch does not matter)."""
        observed = self.by_family.get(strategy.config.key())
        if not observed:
            return self.default_factor
        same_world = [ratio for world, ratio in observed if world == strategy.world_size]
        return same_world[-1] if same_world else observed[-1][1]

    def device_factor(self, gpu_product: str) -> float:
        """Scale of whole predicted peaks on `gpu_product`: its measured allocator gap relative to the
        predicted one, at least every OOM bound's ratio."""
        factor = self.device_factors.get(gpu_product, 1.0)
        return max(factor, self.device_factors[None]) if None in self.device_factors else factor

    def device_terms(self, gpu_product: str) -> DeviceTerms:
        factor = self.device_factor(gpu_product)
        offset = self.device_offsets.get(gpu_product, 0.0)
        if factor < 1.0:
            # A smaller allocator gap scales the tensor part only: peak x f + overhead x (1 - f) is the
            # true peak for the overhead the prediction had; the largest overhead (with NCCL) keeps it an
            # upper bound for every layout.
            offset += MULTI_GPU_OVERHEAD_BYTES * (1.0 - factor)
        return DeviceTerms(factor, offset)


MULTI_GPU_OVERHEAD_BYTES = framework_overhead(Strategy(world_size=2)).fixed_bytes
NO_CORRECTIONS = PeakCorrections({})


def peak_corrections(
    measured: Sequence[MeasuredPeak], shape: Shape, *, calibration: Calibration | None = None,
    devices: Sequence[MeasuredDevice] = (),
) -> PeakCorrections:
    """Corrections from measured peaks (predictions made exactly as the planner makes them)."""
    if not measured and not devices:
        return NO_CORRECTIONS
    by_family: dict[ConfigKey, list[tuple[int, float]]] = {}
    worst = 1.0
    for m in measured:  # the tensor terms first: the device bound is compared after them
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
    factors: dict[str | None, float] = {}
    for m in measured:
        if m.kind == PeakKind.ALLOCATED or m.peak_bytes <= 0:
            continue
        s = m.strategy
        terms = memory_terms(shape, s, calibration=calibration).scaled(tensors.factor(s))
        predicted = terms.peak_bytes(s.config.micro_batch_size, s.config.gradient_accumulation_steps)
        if predicted > 0 and m.peak_bytes > predicted:
            factors[m.gpu_product] = max(factors.get(m.gpu_product, 1.0), m.peak_bytes / predicted)
    offsets: dict[str, float] = {}
    fragmentation = memory_terms(shape, Strategy(), calibration=calibration).fragmentation
    gaps: dict[str, float] = {}
    for d in devices:
        if d.allocated_bytes <= 0 or d.reserved_bytes <= 0:
            continue
        gap = d.reserved_bytes / d.allocated_bytes / fragmentation
        gaps[d.gpu_product] = max(gaps.get(d.gpu_product, 0.0), gap)  # the largest gap seen: cautious
        if d.device_bytes is None:
            continue
        predicted_fixed = framework_overhead(Strategy(world_size=d.world_size)).fixed_bytes
        shift = (d.device_bytes - d.reserved_bytes) - predicted_fixed
        if shift < 0 and d.world_size > 1:
            continue  # NCCL's part is not in a 1-GPU prediction: only a 1-GPU run may lower the context
        current = offsets.get(d.gpu_product)
        offsets[d.gpu_product] = shift if current is None else max(current, shift)
    for product, gap in gaps.items():
        factors[product] = max(factors.get(product, 0.0), gap)
    return PeakCorrections(by_family, worst, factors, offsets)
