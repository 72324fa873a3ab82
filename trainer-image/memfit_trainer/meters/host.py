"""Host memory from /proc: the process RSS and its high-water mark, the machine's total, and the RSS meter."""

from __future__ import annotations

import contextlib
import os

from memfit_trainer.meters.readings import MemorySample


def proc_status_bytes(field: str) -> int:
    """A `/proc/self/status` figure (VmRSS, VmHWM, ...) in bytes; 0 where it cannot be read."""
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def host_total_bytes() -> int:
    """Physical memory of the machine; 0 where sysconf cannot tell."""
    with contextlib.suppress(OSError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return 0


class HostStepMeter:
    """What the step view of a host-memory meter shares: the run's peak so far and the machine's memory."""

    _run_peak: int

    @property
    def run_peak_bytes(self) -> int:
        return self._run_peak

    @property
    def capacity_bytes(self) -> int:
        return host_total_bytes()

    def device_peak_bytes(self) -> int:
        """On a CPU the device is the allocator (or the RSS): the run's peak."""
        return self._run_peak


class RssMeter(HostStepMeter):
    """Process RSS and its high-water mark (VmHWM, reset per step through /proc/self/clear_refs).

    A step view only: the cheaper CPU meter, chosen with MEMFIT_CPU_MEMORY_METER=rss.
    """

    name = "cpu-rss"

    def __init__(self) -> None:
        self._run_peak = 0
        self._step_start = 0

    def _reset_hwm(self) -> None:
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")

    def start(self) -> None:
        self._reset_hwm()
        self._step_start = proc_status_bytes("VmRSS")

    def end_step(self) -> MemorySample:
        rss = proc_status_bytes("VmRSS")
        sample = MemorySample(rss, rss, max(rss, proc_status_bytes("VmHWM")), self._step_start)
        self._run_peak = max(self._run_peak, sample.peak_bytes)
        self._step_start = rss
        self._reset_hwm()
        return sample

    def stop(self) -> None:
        return None
