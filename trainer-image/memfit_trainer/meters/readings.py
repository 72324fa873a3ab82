"""What the meters report: a training step's memory, a marked region's memory, and the two meter views."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class MemorySample:
    """Memory of one step, bytes."""

    allocated_bytes: int
    reserved_bytes: int
    peak_bytes: int
    step_start_bytes: int

    @property
    def transient_peak_bytes(self) -> int:
        """Peak above what was allocated when the step began: activations, gradients, temporaries."""
        return max(0, self.peak_bytes - self.step_start_bytes)


@dataclass(frozen=True, slots=True)
class RegionMemory:
    """Memory seen in one marked region (a training step).

    `peak_allocated_bytes` counts every live tensor byte the allocator handed out, model included.
    `peak_reserved_bytes` is the CUDA caching allocator's reservation (None on CPU, which has no
    cache); `peak_device_bytes` the NVML per-process figure (None where NVML is unavailable).
    """

    name: str
    peak_allocated_bytes: int
    start_allocated_bytes: int
    end_allocated_bytes: int
    seconds: float
    peak_reserved_bytes: int | None = None
    peak_device_bytes: int | None = None


class StepMeter(Protocol):
    """The trainer's view: allocated, reserved and peak bytes per step, and the run's peak."""

    name: str

    def start(self) -> None: ...

    def end_step(self) -> MemorySample: ...

    def stop(self) -> None: ...

    @property
    def run_peak_bytes(self) -> int: ...

    @property
    def capacity_bytes(self) -> int: ...

    def device_peak_bytes(self) -> int:
        """The run's peak as the device sees it: CUDA reserved bytes and NVML process memory on a GPU,
        the allocator's (or RSS) peak on a CPU (the first-steps check)."""
        ...


class RegionMeter(Protocol):
    """The profiler's view: a session (context manager) with named regions, complete after it ends."""

    def __enter__(self) -> RegionMeter: ...

    def __exit__(self, *exc: object) -> None: ...

    def region(self, name: str) -> AbstractContextManager[None]: ...

    def results(self) -> dict[str, RegionMemory]: ...
