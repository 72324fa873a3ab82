"""What one probed process reports: its training steps' memory and time (JSON between hooks and driver)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENDED_AT_STEPS = "steps"  # reached MEMFIT_PROBE_STEPS and ended the process itself
ENDED_AT_EXIT = "exit"  # the script ended first (the result so far, written at interpreter exit)
RUNNING = "running"  # written after every step: what a killed (hung) process leaves
# Monitoring a training pod (memfit_trainer.probe.monitor): a first step measured more than the plan allows,
# and the process ended itself before an out-of-memory.
OVER_PLAN = "over-plan"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One optimizer step: its peak bytes (the meter's; CUDA also reserved), seconds, and the fed micro-batch."""

    step: int
    peak_bytes: int
    step_seconds: float
    micro_batch: int | None  # leading dimension of the step's first outermost module call's first tensor
    reserved_peak_bytes: int | None = None  # CUDA caching allocator reservation; None on CPU


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """A probed process's report."""

    rank: int
    device: str  # cpu or cuda
    memory_meter: str  # the meter's name (memfit_trainer.meters), comparable with memfit's profiler
    steps_wanted: int
    ended: str  # ENDED_AT_STEPS, ENDED_AT_EXIT or RUNNING
    forward_calls: int  # outermost nn.Module calls seen
    steps: tuple[StepRecord, ...] = field(default=())  # the steps read so far
    steps_ended: int = 0  # training steps ended (a step's reading follows it: a hung one may lack it)
    optimizer_steps: int = (
        0  # torch.optim steps run (DeepSpeed runs one per parameter group or ZeRO-3 sub-group)
    )
    # Monitoring a training pod: `steps` holds the first-steps window only; these count every step read.
    steps_read: int = 0
    step_seconds_sum: float = 0.0
    max_peak_bytes: int = 0
    max_reserved_peak_bytes: int | None = None
    budget_bytes: int | None = None  # the plan's prediction plus headroom the first steps are checked against
    over_plan_bytes: int | None = None  # OVER_PLAN: what the check measured (x the injected factor of tests)
    loss: float | None = None  # the latest the script reported (memfit_trainer.probe.report, the HF Trainer's log)
    eval_loss: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> ProbeResult:
        raw: dict[str, Any] = json.loads(text)
        steps = tuple(StepRecord(**row) for row in raw.pop("steps", []))
        return ProbeResult(**raw, steps=steps)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
