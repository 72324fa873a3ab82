"""One micro-batch's figures from its run: the steady step peak, the first step's, and the step time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from memfit_trainer.probe.findings import Outcome, Verdict
from memfit_trainer.probe.records import ProbeResult, StepRecord


@dataclass(frozen=True, slots=True)
class Point:
    """One micro-batch of the ladder. Peaks are the max over ranks, per step; the steady figures are the
    median of the steps after the first (the first step allocates the optimizer state)."""

    micro_batch: int
    outcome: Outcome
    finding: str
    steps_seen: int
    peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    first_step_peak_bytes: int | None = None
    step_seconds: float | None = None
    fed_micro_batch: int | None = None
    memory_meter: str = ""
    device: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"microBatch": self.micro_batch, "outcome": self.outcome.value, "finding": self.finding,
                "stepsSeen": self.steps_seen, "peakBytes": self.peak_bytes,
                "reservedPeakBytes": self.reserved_peak_bytes, "firstStepPeakBytes": self.first_step_peak_bytes,
                "stepSeconds": self.step_seconds, "fedMicroBatch": self.fed_micro_batch,
                "memoryMeter": self.memory_meter, "device": self.device}  # fmt: skip


def merged_steps(results: list[ProbeResult]) -> list[StepRecord]:
    """Per step index, the largest peak (and reservation) and the slowest time over the ranks."""
    by_step: dict[int, list[StepRecord]] = {}
    for result in results:
        for record in result.steps:
            by_step.setdefault(record.step, []).append(record)
    merged = []
    for step in sorted(by_step):
        rows = by_step[step]
        reserved = [r.reserved_peak_bytes for r in rows if r.reserved_peak_bytes is not None]
        merged.append(StepRecord(step=step, peak_bytes=max(r.peak_bytes for r in rows),
                                 step_seconds=max(r.step_seconds for r in rows), micro_batch=rows[0].micro_batch,
                                 reserved_peak_bytes=max(reserved) if reserved else None))  # fmt: skip
    return merged


def summarize(micro_batch: int, verdict: Verdict, results: list[ProbeResult]) -> Point:
    """The micro-batch's point: figures from the steps the ranks recorded (none when there are none)."""
    steps = merged_steps(results)
    seen = max([len(steps), *(r.steps_ended for r in results)])
    base = Point(micro_batch=micro_batch, outcome=verdict.outcome, finding=verdict.finding, steps_seen=seen)
    if not steps:
        return base
    steady = steps[1:] or steps
    reserved = [s.reserved_peak_bytes for s in steady if s.reserved_peak_bytes is not None]
    return Point(
        micro_batch=micro_batch, outcome=verdict.outcome, finding=verdict.finding, steps_seen=seen,
        peak_bytes=int(statistics.median(s.peak_bytes for s in steady)),
        reserved_peak_bytes=int(statistics.median(reserved)) if reserved else None,
        first_step_peak_bytes=steps[0].peak_bytes,
        step_seconds=round(statistics.median(s.step_seconds for s in steady), 6),
        fed_micro_batch=steps[0].micro_batch, memory_meter=results[0].memory_meter, device=results[0].device,
    )  # fmt: skip
