"""Per-rank memory measurement: CUDA allocator statistics on GPUs, the CPU allocator's profiler counter on CPU.

CPU has no allocator statistics API, so the CPU meter keeps `torch.profiler` (profile_memory=True)
open from before the model is built and reads the running `total_allocated` counter that the CPU
allocator reports with every allocation and free: it counts every tensor byte (not Python objects,
not memory BLAS/oneDNN get with their own malloc). Each optimizer step is one profiler cycle, so the
step's peak is the counter's maximum in that cycle. Reserved bytes on CPU are the process RSS.
Set MEMFIT_CPU_MEMORY_METER=rss for a cheaper meter that uses RSS and its high-water mark only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

ENV_CPU_METER = "MEMFIT_CPU_MEMORY_METER"


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


class MemoryMeter(Protocol):
    """Measures allocated, reserved and peak bytes per step."""

    name: str

    def start(self) -> None: ...

    def end_step(self) -> MemorySample: ...

    def stop(self) -> None: ...

    @property
    def run_peak_bytes(self) -> int: ...

    @property
    def capacity_bytes(self) -> int: ...


class CudaMeter:
    """torch.cuda statistics of the current device (the caching allocator's own counters)."""

    name = "cuda-allocator"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._run_peak = 0
        self._step_start = 0

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


def _proc_status_bytes(field: str) -> int:
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _host_total_bytes() -> int:
    with contextlib.suppress(OSError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return 0


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    # Kineto prints two lines per profiler start/stop on fd 2; keep the training log readable.
    with contextlib.suppress(OSError):
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as devnull:
                os.dup2(devnull.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        return
    yield


class CpuAllocatorMeter:
    """Tensor bytes from the CPU allocator's profiler counter; one profiler cycle per step."""

    name = "cpu-allocator-profiler"

    def __init__(self) -> None:
        self._profiler: Any = None
        self._last = MemorySample(0, 0, 0, 0)
        self._current = 0
        self._run_peak = 0
        self._cycle: tuple[int, int, int] | None = None

    def _on_cycle(self, prof: Any) -> None:
        first: int | None = None
        last: int | None = None
        peak = 0
        stack = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
        events: list[tuple[int, int, int]] = []
        while stack:  # pre-order walk; a stable sort by time then keeps record order for equal stamps
            node = stack.pop()
            stack.extend(reversed(node.children))
            if node.tag.name == "Allocation" and node.extra_fields.device.type == "cpu":
                fields = node.extra_fields
                events.append((node.start_time_ns, int(fields.total_allocated), int(fields.alloc_size)))
        events.sort(key=lambda event: event[0])
        for _, total, size in events:
            if first is None:
                first = total - size
            last = total
            peak = max(peak, total)
        self._cycle = None if first is None or last is None else (first, last, peak)

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        with contextlib.suppress(Exception), _quiet_stderr():
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._profiler = profile(
                    activities=[ProfilerActivity.CPU],
                    profile_memory=True,
                    schedule=schedule(wait=0, warmup=0, active=1, repeat=0),
                    on_trace_ready=self._on_cycle,
                )
                self._profiler.start()

    def end_step(self) -> MemorySample:
        self._cycle = None
        if self._profiler is not None:
            import warnings

            with _quiet_stderr(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._profiler.step()
        if self._cycle is not None:
            first, last, peak = self._cycle
            sample = MemorySample(
                allocated_bytes=last,
                reserved_bytes=_proc_status_bytes("VmRSS"),
                peak_bytes=peak,
                step_start_bytes=first,
            )
        else:
            sample = MemorySample(self._current, _proc_status_bytes("VmRSS"), self._current, self._current)
        self._current = sample.allocated_bytes
        self._run_peak = max(self._run_peak, sample.peak_bytes)
        self._last = sample
        return sample

    def stop(self) -> None:
        if self._profiler is not None:
            with contextlib.suppress(Exception), _quiet_stderr():
                self._profiler.stop()
            self._profiler = None

    @property
    def run_peak_bytes(self) -> int:
        return self._run_peak

    @property
    def capacity_bytes(self) -> int:
        return _host_total_bytes()


class RssMeter:
    """Process RSS and its high-water mark (VmHWM, reset per step through /proc/self/clear_refs)."""

    name = "cpu-rss"

    def __init__(self) -> None:
        self._run_peak = 0
        self._step_start = 0

    def _reset_hwm(self) -> None:
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")

    def start(self) -> None:
        self._reset_hwm()
        self._step_start = _proc_status_bytes("VmRSS")

    def end_step(self) -> MemorySample:
        rss = _proc_status_bytes("VmRSS")
        sample = MemorySample(rss, rss, max(rss, _proc_status_bytes("VmHWM")), self._step_start)
        self._run_peak = max(self._run_peak, sample.peak_bytes)
        self._step_start = rss
        self._reset_hwm()
        return sample

    def stop(self) -> None:
        return None

    @property
    def run_peak_bytes(self) -> int:
        return self._run_peak

    @property
    def capacity_bytes(self) -> int:
        return _host_total_bytes()


def make_meter(device: torch.device, environ: dict[str, str] | os._Environ[str]) -> MemoryMeter:
    """The meter for the device: CUDA statistics, or the CPU allocator counter (or RSS when asked)."""
    if device.type == "cuda":
        return CudaMeter(device)
    if environ.get(ENV_CPU_METER, "").strip().lower() == "rss":
        return RssMeter()
    return CpuAllocatorMeter()
