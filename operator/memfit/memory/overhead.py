"""Framework overhead outside PyTorch's allocator statistics: CUDA context, cuBLAS workspace, NCCL,
and caching-allocator fragmentation (shared/reference/memory-model.md §5).

All of these vary by GPU architecture, driver and image; a calibrated Profile (reserved vs allocated
bytes) replaces the fragmentation default, and the operator's measured peaks correct the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.memory.strategy import Device, Strategy

MIB = 1024 * 1024
# CUDA context per process: 0.3-0.7 GB, 287 MB lazy vs 667 MB eager module loading
# (PyTorch PR #86509; pytorch/pytorch #107667, #109888). Mid-range value.
CUDA_CONTEXT_BYTES = 512 * MIB
# cuBLAS workspace: ~8 MiB per (handle, stream), 32 MiB on Hopper (PyTorch PRs #89027, #120925).
CUBLAS_WORKSPACE_BYTES = 32 * MIB
# NCCL buffers per communicator: ~0.5 GB (Fujii et al. 2024, arXiv 2411.06465 calculator); up to
# 1.6 GB reported with many channels (NVIDIA/nccl #391). Invisible to torch.cuda statistics.
NCCL_COMMUNICATOR_BYTES = 512 * MIB
# Caching-allocator reserved / allocated: 1.05-1.3x for static LLM training (cosmos-rl PR #388,
# torchtune #1185); memfit assumes the low end plus margin, and calibrates it from a profile.
DEFAULT_FRAGMENTATION = 1.10


@dataclass(frozen=True, slots=True)
class Overhead:
    """Bytes outside the model's tensors and the allocator's fragmentation factor."""

    fixed_bytes: float
    fragmentation: float


def framework_overhead(strategy: Strategy, *, fragmentation: float = DEFAULT_FRAGMENTATION) -> Overhead:
    """CUDA context + cuBLAS workspace, plus one NCCL communicator when the job is distributed.

    A CPU step has none of them and no caching allocator: its peak is the allocated bytes."""
    if strategy.device == Device.CPU:
        return Overhead(0.0, 1.0)
    fixed = float(CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES)
    if strategy.world_size > 1:
        fixed += NCCL_COMMUNICATOR_BYTES
    return Overhead(fixed, fragmentation)
