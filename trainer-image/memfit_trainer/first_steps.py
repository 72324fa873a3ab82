"""First-steps check: an attempt's measured per-rank peak over its first steps against the plan.

The plan promises that the predicted per-GPU peak plus the job's headroom fits the GPU. The first
steps of an attempt already show every phase of a step (forward, backward, optimizer step, and the
optimizer state created by the first one), so when the largest rank's measured peak is above
`prediction x (1 + headroom)` after any of them, later steps will not fit better: the trainer saves
a checkpoint and stops with `MemoryOverPlan` (exit 89) before the run goes out of memory, and the
operator re-plans from the measured peak and resumes from that checkpoint (docs/operator.md).

What is compared with the plan's predicted device peak: on a GPU, the device's view (CUDA
`max_memory_reserved` and NVML process memory, meters/cuda.py); on a CPU stand-in (tests, the local
pod runner), the allocator's peak. The CPU has no CUDA context, cuBLAS workspace or fragmentation,
which the GPU prediction includes, so there the check only catches gross under-predictions (and the
injected ones of the tests); a CPU run's own allocations (bitsandbytes dequantising its state,
per-tensor optimizer steps) differ from a GPU's by less than that margin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memfit.api import pod as contract
from memfit.api.plan import Plan

ENV_FIRST_STEPS = contract.ENV_FIRST_STEPS  # steps checked per attempt; 0 turns the check off
DEFAULT_FIRST_STEPS = 3
# Tests and chaos drills: the measured peak is multiplied by this factor (annotation
# memfit.dev/inject-peak-factor), so that a CPU run can exceed its GPU plan on purpose.
ENV_INJECT_PEAK_FACTOR = contract.ENV_INJECT_PEAK_FACTOR


class MemoryOverPlan(RuntimeError):
    """The first steps' measured peak exceeded the plan's prediction plus headroom."""

    def __init__(self, *, step: int, peak_bytes: int, budget_bytes: int, predicted_bytes: int) -> None:
        super().__init__(
            f"measured peak {peak_bytes / 2**30:.2f} GiB at step {step} exceeds the plan's prediction "
            f"{predicted_bytes / 2**30:.2f} GiB plus headroom ({budget_bytes / 2**30:.2f} GiB): "
            "stopping before an out-of-memory to re-plan"
        )
        self.step = step
        self.peak_bytes = peak_bytes
        self.budget_bytes = budget_bytes


@dataclass(frozen=True, slots=True)
class FirstStepsCheck:
    """How many steps to check and against what."""

    steps: int
    predicted_bytes: int
    budget_bytes: int
    inject_factor: float = 1.0

    @staticmethod
    def for_plan(plan: Plan, *, environ: Mapping[str, str]) -> FirstStepsCheck | None:
        """The check for this plan; None when turned off or the plan has no prediction."""
        raw = environ.get(ENV_FIRST_STEPS, "").strip()
        steps = int(raw) if raw.isdigit() else DEFAULT_FIRST_STEPS
        predicted = plan.memory.peak_bytes
        if steps <= 0 or predicted <= 0:
            return None
        try:
            factor = float(environ.get(ENV_INJECT_PEAK_FACTOR, "") or 1.0)
        except ValueError:
            factor = 1.0
        budget = int(predicted * (1 + plan.headroom_percent / 100))
        return FirstStepsCheck(steps, predicted, budget, max(factor, 0.0))

    def checks(self, step: int, *, start_step: int) -> bool:
        """Whether `step` is one of the attempt's first steps (counted from where it resumed)."""
        return step - start_step <= self.steps

    def measured(self, peak_bytes: int) -> int:
        return int(peak_bytes * self.inject_factor)

    def verdict(self, step: int, peak_bytes: int) -> MemoryOverPlan | None:
        """The error to stop with when `peak_bytes` (largest rank) is over the budget, else None."""
        if peak_bytes <= self.budget_bytes:
            return None
        return MemoryOverPlan(step=step, peak_bytes=peak_bytes, budget_bytes=self.budget_bytes,
                              predicted_bytes=self.predicted_bytes)
