"""PURE step-time model: model shape + strategy + GPU rates -> seconds per optimizer step.

A roofline per op class (`roofline`, the per-token work in `block_work`), collectives, offload and the
optimizer step (`step`). No torch, kopf or Kubernetes imports. The planner calls `time_terms` thousands
of times; one-off callers use `estimate_step_seconds`. Kept apart from `memfit.memory`: step time does
not change a predicted byte, and the memory-accuracy benchmark measures only what does.
"""

from __future__ import annotations

from memfit.timing.step import (
    GpuSpeed,
    StepTime,
    TimeTerms,
    estimate_step_seconds,
    flops_per_sample,
    time_terms,
)

__all__ = ["GpuSpeed", "StepTime", "TimeTerms", "estimate_step_seconds", "flops_per_sample", "time_terms"]
