"""Memory meters: one CPU and one CUDA meter, each with a per-step view (the trainer) and a per-region
view (the profiler, benchmarks).

- `cpu.CpuAllocatorMeter`: the CPU allocator's profiler counter (tensor bytes).
- `cuda.CudaMeter`: the CUDA caching allocator's statistics, plus NVML per region.
- `simulated.SimulatedGpuMeter`: the CPU allocator meter plus a simulated GPU's reservation and
  context (MEMFIT_SIMULATED_GPU; the local test cluster's GPU pools, where no GPU exists).
- `host.RssMeter`: process RSS and its high-water mark, the cheaper per-step CPU meter
  (MEMFIT_CPU_MEMORY_METER=rss).
"""

from __future__ import annotations

import os

import torch
from memfit.api import pod as contract

from memfit_trainer.meters.cpu import CpuAllocatorMeter
from memfit_trainer.meters.cuda import CudaMeter
from memfit_trainer.meters.host import RssMeter
from memfit_trainer.meters.readings import MemorySample, RegionMemory, RegionMeter, StepMeter
from memfit_trainer.meters.simulated import ENV_SIMULATED_GPU, SimulatedGpu, SimulatedGpuMeter

ENV_CPU_METER = contract.ENV_CPU_MEMORY_METER

__all__ = [
    "ENV_CPU_METER",
    "ENV_SIMULATED_GPU",
    "CpuAllocatorMeter",
    "CudaMeter",
    "MemorySample",
    "RegionMemory",
    "RegionMeter",
    "RssMeter",
    "SimulatedGpuMeter",
    "StepMeter",
    "region_meter",
    "step_meter",
]


def step_meter(device: torch.device, environ: dict[str, str] | os._Environ[str]) -> StepMeter:
    """The trainer's meter for the device: CUDA statistics, or the CPU allocator counter (or RSS when asked)."""
    if device.type == "cuda":
        return CudaMeter(device)
    simulated = SimulatedGpu.from_env(environ)
    if simulated is not None:
        return SimulatedGpuMeter(simulated)
    if environ.get(ENV_CPU_METER, "").strip().lower() == "rss":
        return RssMeter()
    return CpuAllocatorMeter()


def region_meter(device: torch.device) -> RegionMeter:
    """The profiler's meter for the device: CUDA statistics (+ NVML) on a GPU, the CPU allocator trace elsewhere."""
    if device.type == "cuda":
        return CudaMeter(device)
    return CpuAllocatorMeter()
