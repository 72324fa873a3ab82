"""Profiler: measure a problem's peak memory, step time and FLOPs under a few configurations.

`memfit-trainer profile` (cli.py) runs `profile_problem` (run.py) and emits the Profile contract.
Memory truth is allocator-level, from the region view of memfit_trainer.meters: torch.cuda statistics
and NVML on a GPU (meters/cuda.py), the CPU allocator's profiler counter on a CPU (meters/cpu.py). Zero-GPU analysis of configurations that cannot
run here (larger micro-batches, FSDP at other world sizes) lives in fake.py (MemTracker under
FakeTensorMode). Imports stay lazy: `import memfit_trainer.profiler` does not import torch.
"""

from __future__ import annotations

from memfit_trainer.profiler.configs import DEFAULT_CONFIGS, ProfileConfig, full_grid, parse_configs
from memfit_trainer.profiler.errors import (
    EXIT_INVALID_PROBLEM,
    EXIT_OK,
    EXIT_PROFILE_FAILED,
    ProfileInputError,
    ProfileRunError,
)

__all__ = [
    "DEFAULT_CONFIGS",
    "EXIT_INVALID_PROBLEM",
    "EXIT_OK",
    "EXIT_PROFILE_FAILED",
    "ProfileConfig",
    "ProfileInputError",
    "ProfileRunError",
    "full_grid",
    "parse_configs",
]
