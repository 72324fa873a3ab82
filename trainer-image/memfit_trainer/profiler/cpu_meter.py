"""Allocator-level CPU memory truth: torch.profiler's record of every CPU-allocator call.

With `profile_memory=True`, each allocation and free on a profiled thread is recorded with the
allocator's running `total_allocated` counter (c10 ProfiledCPUMemoryReporter). The maximum of that
counter inside a `record_function` region is the region's peak; the counter just before the session's
first allocation is the baseline every figure is reported against, so a session opened before the
model is built counts parameters, gradients, optimizer state, activations and temporaries alike.

It shares nothing with memfit's predictor or with tensor-tracking tracers (MemTracker): it sees
allocations inside kernels (convolution workspaces, bitsandbytes buffers, checkpoint RNG state).
Allocations on other threads are not counted, so callers run with one intra-op thread
(shared/reference/cpu-runtime.md, "An allocator-level memory truth on CPU").
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from memfit_trainer.profiler.meters import RegionMemory

MARK_PREFIX = "memfit::"


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

    def __enter__(self) -> CpuAllocatorMeter:
        # Worker-thread allocations are invisible to the counter (see the module docstring).
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._prof is not None
        self._prof.__exit__(None, None, None)
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
