"""What a memory meter reports for a region of the program, and how the profiler picks one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch


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


class MemoryMeter(Protocol):
    """A session (context manager) with named regions; results are complete after the session ends."""

    def __enter__(self) -> MemoryMeter: ...

    def __exit__(self, *exc: object) -> None: ...

    def region(self, name: str) -> AbstractContextManager[None]: ...

    def results(self) -> dict[str, RegionMemory]: ...


def meter_for(device: torch.device) -> MemoryMeter:
    """CUDA statistics (+ NVML) on a GPU, the CPU allocator trace elsewhere."""
    if device.type == "cuda":
        from memfit_trainer.profiler.cuda_meter import CudaMeter

        return CudaMeter(device)
    from memfit_trainer.profiler.cpu_meter import CpuAllocatorMeter

    return CpuAllocatorMeter()


def iter_regions(results: dict[str, RegionMemory], prefix: str) -> Iterator[RegionMemory]:
    """Regions whose name starts with `prefix`, in name order."""
    for name in sorted(results):
        if name.startswith(prefix):
            yield results[name]
