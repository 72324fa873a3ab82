"""One memory reading per training step, from the same meters memfit's trainer and profiler use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from memfit.api import pod as contract

from memfit_trainer.meters import CudaMeter, StepMeter, step_meter


@dataclass(frozen=True, slots=True)
class StepMemory:
    peak_bytes: int
    reserved_peak_bytes: int | None


class StepReader(Protocol):
    device: str
    meter_name: str

    def read(self) -> StepMemory:
        """The peak since the previous reading (and start the next step's)."""
        ...

    def close(self) -> None:
        """Stop measuring (at interpreter exit: a CPU profiler still running then crashes the process)."""
        ...


class CpuReader:
    """memfit's CPU step meter (the allocator counter, or RSS or a simulated GPU when the env asks),
    started when the probe is installed: before the script builds its model, as memfit's trainer does."""

    device = "cpu"

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._meter: StepMeter = step_meter(torch.device("cpu"), dict(environ))
        self.meter_name = self._meter.name
        self._meter.start()

    def read(self) -> StepMemory:
        return StepMemory(peak_bytes=self._meter.end_step().peak_bytes, reserved_peak_bytes=None)

    def close(self) -> None:
        self._meter.stop()


class CudaReader:
    """The caching allocator's peak statistics on the script's current device, reset after each reading
    (CUDA is not touched before the first step: the script picks its device)."""

    device = "cuda"
    meter_name = CudaMeter.name

    def read(self) -> StepMemory:
        index = torch.cuda.current_device()
        torch.cuda.synchronize(index)
        memory = StepMemory(
            peak_bytes=int(torch.cuda.max_memory_allocated(index)),
            reserved_peak_bytes=int(torch.cuda.max_memory_reserved(index)),
        )
        torch.cuda.reset_peak_memory_stats(index)
        return memory

    def close(self) -> None:
        return None


def reader_for(environ: Mapping[str, str]) -> StepReader:
    """CUDA statistics when a GPU is visible (unless MEMFIT_DEVICE=cpu, as memfit's trainer), else the CPU meter."""
    wanted = environ.get(contract.ENV_DEVICE, "").strip().lower()
    if wanted != "cpu" and torch.cuda.is_available():
        return CudaReader()
    return CpuReader(environ)
