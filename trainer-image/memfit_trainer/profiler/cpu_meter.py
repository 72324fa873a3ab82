"""Allocator-level CPU memory truth: torch.profiler's record of every CPU-allocator call.

With `profile_memory=True`, each allocation and free on a profiled thread is recorded with the
allocator's running `total_allocated` counter (c10 ProfiledCPUMemoryReporter). The maximum of that
counter inside a `record_function` region is the region's peak; the counter just before the session's
first allocation is the baseline every figure is reported against, so a session opened before the
model is built counts parameters, gradients, optimizer state, activations and temporaries alike.

It shares nothing with memfit's predictor or with tensor-tracking tracers (MemTracker): it sees
allocations inside kernels (convolution workspaces, bitsandbytes buffers, checkpoint RNG state).

The counter only moves for allocations and frees on threads where the profiler is active
(shared/reference/cpu-runtime.md, "An allocator-level memory truth on CPU"). A tensor allocated on the
main thread and freed on a gloo or DeepSpeed worker thread would then never be subtracted: seen as
run-to-run differences of up to 10 MiB on DeepSpeed and FSDP cases at world size 2. During a session
the meter therefore also sets c10's `FLAGS_caffe2_report_cpu_memory_usage` (exported by libc10),
which makes the counter account every thread, and raises `FLAGS_caffe2_log_level` to ERROR so that
frees of blocks allocated before the session do not log warnings; both are restored afterwards.
Events are still recorded on profiled threads only, so the session also runs one intra-op thread.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from memfit_trainer.profiler.meters import RegionMemory

MARK_PREFIX = "memfit::"
C10_LOG_ERROR = 2  # c10 severity levels: INFO 0, WARNING 1, ERROR 2, FATAL 3


class _C10Flags:
    """c10's process-wide allocation reporting flag and log level, set for the session, then restored."""

    def __init__(self) -> None:
        self._report: ctypes.c_bool | None = None
        self._level: ctypes.c_int | None = None
        try:
            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
            self._report = ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")
            self._level = ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
        except (OSError, ValueError):  # another platform or build: main-thread accounting only
            self._report = self._level = None
        self._saved: tuple[bool, int] | None = None

    @property
    def available(self) -> bool:
        return self._report is not None

    def enable(self) -> None:
        if self._report is None or self._level is None:
            return
        self._saved = (bool(self._report.value), int(self._level.value))
        self._level.value = max(self._level.value, C10_LOG_ERROR)
        self._report.value = True

    def restore(self) -> None:
        if self._report is None or self._level is None or self._saved is None:
            return
        self._report.value, self._level.value = self._saved
        self._saved = None


@dataclass(slots=True)
class _Span:
    seconds: float = 0.0


@dataclass(slots=True)
class CpuAllocatorMeter:
    """A profiling session; `region(name)` marks a span whose peak is reported by `results()`."""

    _prof: profile | None = None
    _spans: dict[str, _Span] = field(default_factory=dict)
    _results: dict[str, RegionMemory] | None = None
    _threads: int = 0
    _flags: _C10Flags | None = None

    @property
    def all_threads(self) -> bool:
        """Whether the counter accounts allocations and frees of every thread (c10 flag available)."""
        return self._flags is not None and self._flags.available

    def __enter__(self) -> CpuAllocatorMeter:
        # Events are recorded on profiled threads only (see the module docstring).
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self._flags = _C10Flags()
        self._flags.enable()
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._prof is not None
        self._prof.__exit__(None, None, None)
        if self._flags is not None:
            self._flags.restore()
        torch.set_num_threads(self._threads)
        self._results = _regions(self._prof, self._spans)
        self._prof = None

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Mark a region; names must be unique within the session."""
        if name in self._spans:
            raise ValueError(f"region {name!r} marked twice")
        span = self._spans[name] = _Span()
        start = time.perf_counter()
        with record_function(MARK_PREFIX + name):
            yield
        span.seconds = time.perf_counter() - start

    def results(self) -> dict[str, RegionMemory]:
        """Per-region peaks, relative to the allocator counter before the session's first allocation."""
        if self._results is None:
            raise RuntimeError("results are available after the session ends")
        return self._results


def allocation_events(prof: profile) -> tuple[list[int], list[int], list[int]]:
    """(time_ns, total_allocated after the event, bytes) of every allocation and free, time-ordered."""
    from torch._C._profiler import _EventType

    rows: list[tuple[int, int, int]] = []
    stack: list[Any] = _event_tree(prof)
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            extra = event.extra_fields
            rows.append((event.start_time_ns, int(extra.total_allocated), int(extra.alloc_size)))
        stack.extend(event.children)
    rows.sort()
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _event_tree(prof: profile) -> list[Any]:
    results: Any = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise RuntimeError("the profiler recorded no events")
    return list(results.experimental_event_tree())


def _marks(prof: profile) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    stack: list[Any] = _event_tree(prof)
    while stack:
        event = stack.pop()
        if event.name.startswith(MARK_PREFIX):
            out[event.name[len(MARK_PREFIX) :]] = (event.start_time_ns, event.end_time_ns)
        stack.extend(event.children)
    return out


def _regions(prof: profile, spans: dict[str, _Span]) -> dict[str, RegionMemory]:
    times, totals, sizes = allocation_events(prof)
    baseline = totals[0] - sizes[0] if totals else 0
    out: dict[str, RegionMemory] = {}
    for name, (start_ns, end_ns) in _marks(prof).items():
        lo = bisect.bisect_left(times, start_ns)
        hi = bisect.bisect_right(times, end_ns)
        before = totals[lo - 1] if lo > 0 else baseline
        inside = totals[lo:hi]
        after = totals[hi - 1] if hi > lo else before
        out[name] = RegionMemory(
            name=name,
            peak_allocated_bytes=max([before, *inside]) - baseline,
            start_allocated_bytes=before - baseline,
            end_allocated_bytes=after - baseline,
            seconds=spans[name].seconds if name in spans else (end_ns - start_ns) / 1e9,
        )
    return out
