"""Measured peaks from earlier attempts (auto-downsizing and OOM re-plans).

The operator passes what it observed: the strategy that ran and its per-GPU peak (NVML / reserved
bytes; after a CUDA OOM, the GPU's capacity, a lower bound). Each observation gives a ratio
measured / predicted for that configuration. A candidate of the same family (engine, stage,
precision, checkpointing, offload, 8-bit) is scaled by the ratio of the observation with its own
world size and micro-batch when there is one, else by the family's latest observation; any other
candidate is scaled by the largest ratio above 1 (a known under-prediction makes every unmeasured
prediction more cautious, an over-prediction never shrinks an unmeasured one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memfit.api.training_config import ConfigKey
from memfit.memory.calibration import Calibration
from memfit.memory.predict import memory_terms
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy


@dataclass(frozen=True, slots=True)
class MeasuredPeak:
    """One observed per-GPU peak of a configuration that ran."""

    strategy: Strategy
    peak_bytes: int


@dataclass(frozen=True, slots=True)
class PeakCorrections:
    """Ratios measured / predicted by family, and the global cautious factor."""

    by_family: dict[ConfigKey, list[tuple[int, float]]]  # (world size, ratio), oldest first
    default_factor: float = 1.0

    def factor(self, strategy: Strategy) -> float:
        """Scale for the predicted peak of `strategy` (its micro-batch does not matter)."""
        observed = self.by_family.get(strategy.config.key())
        if not observed:
            return self.default_factor
        same_world = [ratio for world, ratio in observed if world == strategy.world_size]
        return same_world[-1] if same_world else observed[-1][1]


NO_CORRECTIONS = PeakCorrections({})


def peak_corrections(
    measured: Sequence[MeasuredPeak], shape: Shape, *, calibration: Calibration | None = None,
) -> PeakCorrections:
    """Ratios from measured peaks (predictions made exactly as the planner makes them)."""
    if not measured:
        return NO_CORRECTIONS
    by_family: dict[ConfigKey, list[tuple[int, float]]] = {}
    worst = 1.0
    for m in measured:
        s = m.strategy
        predicted = memory_terms(shape, s, calibration=calibration).peak_bytes(
            s.config.micro_batch_size, s.config.gradient_accumulation_steps
        )
        if predicted <= 0 or m.peak_bytes <= 0:
            continue
        ratio = m.peak_bytes / predicted
        by_family.setdefault(s.config.key(), []).append((s.world_size, ratio))
        worst = max(worst, ratio)
    return PeakCorrections(by_family, worst)
