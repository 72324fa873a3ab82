"""A simulated GPU meter for machines without a GPU (the local test cluster's KWOK GPU pools).

It is the CPU allocator meter (real tensor bytes of the real run) with what a GPU would add on top,
from MEMFIT_SIMULATED_GPU (JSON, set by the test bed's pod runner from the node's
`memfit.dev/simulated-gpu` annotation): the caching allocator's reservation = allocated x
`fragmentation`, and the process's NVML bytes = reservation + `contextMiB`. Only the GPU-side numbers
are simulated: a GPU cannot exist here. Never selected on a real GPU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from memfit.api import pod as contract

from memfit_trainer.meters.cpu import CpuAllocatorMeter
from memfit_trainer.meters.readings import MemorySample

ENV_SIMULATED_GPU = contract.ENV_SIMULATED_GPU
MIB = 2**20


@dataclass(frozen=True, slots=True)
class SimulatedGpu:
    fragmentation: float
    context_bytes: int

    @staticmethod
    def from_env(environ: Mapping[str, str]) -> SimulatedGpu | None:
        """The simulation asked for, or None; a malformed value is an error naming the variable."""
        raw = environ.get(ENV_SIMULATED_GPU, "").strip()
        if not raw:
            return None
        try:
            spec = json.loads(raw)
            fragmentation = float(spec["fragmentation"])
            context_mib = float(spec["contextMiB"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{ENV_SIMULATED_GPU} must be JSON like {{\"fragmentation\": 1.02, \"contextMiB\": 300}}; "
                f"got {raw!r} ({error})"
            ) from error
        if not 1.0 <= fragmentation <= 4.0 or not 0 <= context_mib <= 65536:
            raise ValueError(f"{ENV_SIMULATED_GPU}: fragmentation must be 1..4 and contextMiB 0..65536; got {raw!r}")
        return SimulatedGpu(fragmentation, int(context_mib * MIB))


class SimulatedGpuMeter(CpuAllocatorMeter):
    """CPU allocator bytes, with a simulated GPU's reservation and NVML bytes."""

    name = "simulated-gpu"

    def __init__(self, gpu: SimulatedGpu) -> None:
        super().__init__()
        self.gpu = gpu

    def end_step(self) -> MemorySample:
        sample = super().end_step()
        reserved = int(sample.allocated_bytes * self.gpu.fragmentation)
        return MemorySample(sample.allocated_bytes, reserved, sample.peak_bytes, sample.step_start_bytes)

    @property
    def run_reserved_peak_bytes(self) -> int:
        return int(self.run_peak_bytes * self.gpu.fragmentation)

    @property
    def run_device_peak_bytes(self) -> int:
        return self.run_reserved_peak_bytes + self.gpu.context_bytes

    # device_peak_bytes (the first-steps check) stays the allocator's peak, as on any CPU stand-in: the
    # simulated reservation and context are the test bed's learning scenarios, not a real device that
    # could run out of memory (memfit_trainer/first_steps.py).
