"""CUDA memory truth: the caching allocator's statistics per step or per region, plus NVML per-process memory.

`max_memory_allocated` (T1) and `max_memory_reserved` (T2) come from PyTorch's caching allocator;
NVML's per-process "used GPU memory" (T3) also sees the CUDA context, cuBLAS workspaces and NCCL
buffers, which PyTorch cannot (shared/reference/memory-model.md §5, §9).

One meter, two views: per step (the trainer) resets the peak statistics after each step; per region
(the profiler) resets them at each region's start, synchronises around it, and samples NVML from a
thread every 10 ms during the region (without pynvml, or on a GPU it cannot query, T3 is None).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from memfit_trainer.meters.readings import MemorySample, RegionMemory

NVML_PERIOD_SECONDS = 0.01


class NvmlSampler:
    """Peak NVML used-memory of this process on one GPU, sampled in a background thread."""

    def __init__(self, device_index: int) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(device_index))
        except Exception:  # pynvml missing, no driver, or an index NVML cannot map: T3 unavailable
            self._nvml = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def sample(self) -> int | None:
        """This process's used GPU memory now, in bytes (None when NVML cannot tell)."""
        if self._nvml is None:
            return None
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:
            return None
        pid = os.getpid()
        used = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
        return int(sum(used)) if used else None

    def start(self) -> None:
        self._peak = 0
        if self._nvml is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="memfit-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> int | None:
        """Stop sampling; the peak seen since `start` (None without NVML)."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        last = self.sample()
        return max(self._peak, last or 0) or None

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.sample()
            if value is not None:
                self._peak = max(self._peak, value)
            self._stop.wait(NVML_PERIOD_SECONDS)


def _physical_index(index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if parts and index < len(parts) and parts[index].isdigit():
        return int(parts[index])
    return index


class CudaMeter:
    """torch.cuda statistics of one device (the caching allocator's own counters), per step or per region."""

    name = "cuda-allocator"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # per step
        self._run_peak = 0
        self._run_peak_reserved = 0
        self._step_start = 0
        self._process: NvmlSampler | None = None
        # per region
        self._results: dict[str, RegionMemory] = {}
        self._nvml: NvmlSampler | None = None

    # --- per step ---------------------------------------------------------------------------------

    def start(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        self._step_start = torch.cuda.memory_allocated(self.device)

    def end_step(self) -> MemorySample:
        sample = MemorySample(
            allocated_bytes=torch.cuda.memory_allocated(self.device),
            reserved_bytes=torch.cuda.memory_reserved(self.device),
            peak_bytes=torch.cuda.max_memory_allocated(self.device),
            step_start_bytes=self._step_start,
        )
        self._run_peak = max(self._run_peak, sample.peak_bytes)
        self._run_peak_reserved = max(self._run_peak_reserved, torch.cuda.max_memory_reserved(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        self._step_start = sample.allocated_bytes
        return sample

    def stop(self) -> None:
        self._run_peak = max(self._run_peak, torch.cuda.max_memory_allocated(self.device))

    @property
    def run_peak_bytes(self) -> int:
        return max(self._run_peak, torch.cuda.max_memory_allocated(self.device))

    @property
    def capacity_bytes(self) -> int:
        return int(torch.cuda.get_device_properties(self.device).total_memory)

    def device_peak_bytes(self) -> int:
        """The larger of the caching allocator's peak reservation and NVML's per-process used memory now
        (CUDA context, cuBLAS workspaces and NCCL buffers that PyTorch does not see; the allocator keeps
        its reservation, so the figure at a step's end includes the step's peak)."""
        reserved = max(self._run_peak_reserved, torch.cuda.max_memory_reserved(self.device))
        if self._process is None:
            self._process = NvmlSampler(self.device.index or 0)
        return max(reserved, self._process.sample() or 0)

    @property
    def run_reserved_peak_bytes(self) -> int:
        """The caching allocator's largest reservation (allocated bytes plus its fragmentation)."""
        return max(self._run_peak_reserved, int(torch.cuda.max_memory_reserved(self.device)))

    # --- per region -------------------------------------------------------------------------------

    def __enter__(self) -> CudaMeter:
        self._nvml = NvmlSampler(self.device.index or 0)
        return self

    def __exit__(self, *exc: object) -> None:
        self._nvml = None

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Mark a region; names must be unique within the session."""
        if name in self._results:
            raise ValueError(f"region {name!r} marked twice")
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        start_bytes = torch.cuda.memory_allocated(self.device)
        assert self._nvml is not None, "region() outside the meter session"
        self._nvml.start()
        start = time.perf_counter()
        yield
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        self._results[name] = RegionMemory(
            name=name,
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
            start_allocated_bytes=start_bytes,
            end_allocated_bytes=torch.cuda.memory_allocated(self.device),
            seconds=seconds,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device),
            peak_device_bytes=self._nvml.stop(),
        )

    def results(self) -> dict[str, RegionMemory]:
        return dict(self._results)
