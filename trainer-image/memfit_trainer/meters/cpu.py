"""CPU memory truth at allocator level: torch.profiler's record of every CPU-allocator call.

With `profile_memory=True`, each allocation and free on a profiled thread is recorded with the
allocator's running `total_allocated` counter (c10 ProfiledCPUMemoryReporter): it counts every tensor
byte (not Python objects, not memory BLAS/oneDNN get with their own malloc), and it sees allocations
inside kernels (convolution workspaces, bitsandbytes buffers, checkpoint RNG state). It shares
nothing with memfit's predictor or with tensor-tracking tracers (MemTracker).

One meter, two views of the same counter:

- per step (the trainer): `start()` before the model is built, `end_step()` after each optimizer
  step. Each step is one profiler cycle, so the step's peak is the counter's maximum in that cycle.
  Reserved bytes on CPU are the process RSS.
- per region (the profiler): a session (`with meter:`) opened before the model is built, with named
  `region(name)` marks. The maximum of the counter inside a region is the region's peak; the counter
  just before the session's first allocation is the baseline every figure is reported against, so
  parameters, gradients, optimizer state, activations and temporaries all count.

The counter only moves for allocations and frees on threads where the profiler is active
(shared/reference/cpu-runtime.md, "An allocator-level memory truth on CPU"). A tensor allocated on the
main thread and freed on a gloo or DeepSpeed worker thread would then never be subtracted: seen as
run-to-run differences of up to 10 MiB on DeepSpeed and FSDP cases at world size 2. During a region
session the meter therefore also sets c10's `FLAGS_caffe2_report_cpu_memory_usage` (exported by
libc10), which makes the counter account every thread, and raises `FLAGS_caffe2_log_level` to ERROR so
that frees of blocks allocated before the session do not log warnings; both are restored afterwards.
Events are still recorded on profiled threads only, so the session also runs one intra-op thread.
The step view keeps the trainer's threads and leaves the flags alone (a training run's numbers).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import gc
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from memfit_trainer.meters.host import HostStepMeter, proc_status_bytes
from memfit_trainer.meters.readings import MemorySample, RegionMemory

MARK_PREFIX = "memfit::"
C10_LOG_ERROR = 2  # c10 severity levels: INFO 0, WARNING 1, ERROR 2, FATAL 3

# (time_ns, total_allocated after the event, bytes allocated (> 0) or freed (< 0))
Row = tuple[int, int, int]


class C10Flags:
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


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence fd 2: Kineto prints two lines per profiler start/stop; keep the training log readable."""
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


def event_tree(prof: profile) -> list[Any]:
    """The profiler's top-level events (each with its children)."""
    results: Any = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise RuntimeError("the profiler recorded no events")
    return list(results.experimental_event_tree())


def allocation_rows(prof: profile) -> list[Row]:
    """Every CPU allocation and free, ordered by time; events with the same stamp keep record order."""
    rows: list[Row] = []
    stack = list(reversed(event_tree(prof)))
    while stack:  # pre-order walk, so that the stable sort below keeps record order for equal stamps
        node = stack.pop()
        stack.extend(reversed(node.children))
        if node.tag.name == "Allocation" and node.extra_fields.device.type == "cpu":
            fields = node.extra_fields
            rows.append((node.start_time_ns, int(fields.total_allocated), int(fields.alloc_size)))
    rows.sort(key=lambda row: row[0])
    return rows


def _marks(prof: profile) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    stack: list[Any] = event_tree(prof)
    while stack:
        event = stack.pop()
        if event.name.startswith(MARK_PREFIX):
            out[event.name[len(MARK_PREFIX) :]] = (event.start_time_ns, event.end_time_ns)
        stack.extend(event.children)
    return out


def _regions(prof: profile, seconds: dict[str, float]) -> dict[str, RegionMemory]:
    # The region view orders events of equal stamps by counter value (its figures since it was
    # written; record order is the step view's).
    rows = sorted(allocation_rows(prof))
    times, totals = [r[0] for r in rows], [r[1] for r in rows]
    baseline = rows[0][1] - rows[0][2] if rows else 0
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
            seconds=seconds[name] if name in seconds else (end_ns - start_ns) / 1e9,
        )
    return out


@dataclass(slots=True)
class _Cycle:
    """The counter over one step's profiler cycle: before its first event, after its last, and its peak."""

    first: int
    last: int
    peak: int


class CpuAllocatorMeter(HostStepMeter):
    """Tensor bytes from the CPU allocator's profiler counter, per step or per marked region."""

    name = "cpu-allocator-profiler"

    def __init__(self) -> None:
        self._prof: Any = None
        # per step
        self._current = 0
        self._run_peak = 0
        self._cycle: _Cycle | None = None
        # per region
        self._seconds: dict[str, float] = {}
        self._results: dict[str, RegionMemory] | None = None
        self._threads = 0
        self._flags: C10Flags | None = None

    # --- per step ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the first step's profiler cycle (before the model exists, so the counter sees it)."""
        with contextlib.suppress(Exception), quiet_stderr(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._prof = profile(
                activities=[ProfilerActivity.CPU],
                profile_memory=True,
                schedule=schedule(wait=0, warmup=0, active=1, repeat=0),
                on_trace_ready=self._on_cycle,
            )
            self._prof.start()

    def _on_cycle(self, prof: profile) -> None:
        rows = allocation_rows(prof)
        if not rows:
            self._cycle = None
            return
        peak = max(0, *(total for _, total, _ in rows))
        self._cycle = _Cycle(first=rows[0][1] - rows[0][2], last=rows[-1][1], peak=peak)

    def end_step(self) -> MemorySample:
        """Close this step's cycle (and open the next): its memory."""
        self._cycle = None
        if self._prof is not None:
            with quiet_stderr(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._prof.step()
        rss = proc_status_bytes("VmRSS")
        if self._cycle is not None:
            cycle = self._cycle
            sample = MemorySample(
                allocated_bytes=cycle.last,
                reserved_bytes=rss,
                peak_bytes=cycle.peak,
                step_start_bytes=cycle.first,
            )
        else:
            sample = MemorySample(self._current, rss, self._current, self._current)
        self._current = sample.allocated_bytes
        self._run_peak = max(self._run_peak, sample.peak_bytes)
        return sample

    def stop(self) -> None:
        if self._prof is not None:
            with contextlib.suppress(Exception), quiet_stderr():
                self._prof.stop()
            self._prof = None

    # --- per region -------------------------------------------------------------------------------

    @property
    def all_threads(self) -> bool:
        """Whether the counter accounts allocations and frees of every thread (c10 flag available)."""
        return self._flags is not None and self._flags.available

    def __enter__(self) -> CpuAllocatorMeter:
        # Garbage left by an earlier session (a model in a reference cycle) would otherwise be collected inside
        # this one: c10 still knows those blocks' sizes, so their frees would lower the counter below the
        # baseline and every later figure with it (seen as a second run in one process reading 6 MiB low).
        gc.collect()
        # Events are recorded on profiled threads only (see the module docstring).
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self._flags = C10Flags()
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
        self._results = _regions(self._prof, self._seconds)
        self._prof = None

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Mark a region; names must be unique within the session."""
        if name in self._seconds:
            raise ValueError(f"region {name!r} marked twice")
        self._seconds[name] = 0.0
        start = time.perf_counter()
        with record_function(MARK_PREFIX + name):
            yield
        self._seconds[name] = time.perf_counter() - start

    def results(self) -> dict[str, RegionMemory]:
        """Per-region peaks, relative to the allocator counter before the session's first allocation."""
        if self._results is None:
            raise RuntimeError("results are available after the session ends")
        return self._results
