"""Step time of elided steps: what ran for real, plus the skipped work at measured device rates.

An elided step (elide.py) skips compute-bound operators (and, at the memory-bound level, the other
large ones too). Its wall time, plus the skipped FLOPs divided by this device's measured GEMM
throughput for the same dtype, plus the skipped bytes divided by its measured copy bandwidth, models
the real step time. It is a model: docs/profiler.md says how close it comes on this CPU.
"""

from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import _disable_current_modes

GEMM_REPEATS = 3
GEMM_MAX_ROWS = 512  # rows of the timing GEMM: enough to reach steady throughput, cheap on a CPU
COPY_MEGABYTES = 64  # larger than any CPU cache, so the copy runs at memory bandwidth


def gemm_flops_per_second(
    dtype: torch.dtype, *, rows: int, inner: int, cols: int, device: torch.device
) -> float:
    """Best-of-3 throughput of a [rows x inner] @ [inner x cols] matmul in `dtype` (FLOP/s)."""
    rows = max(1, min(rows, GEMM_MAX_ROWS))
    with _disable_current_modes():  # measured inside ElideCompute, which would skip the matmul
        return _time_gemm(dtype, rows=rows, inner=inner, cols=cols, device=device)


def _time_gemm(dtype: torch.dtype, *, rows: int, inner: int, cols: int, device: torch.device) -> float:
    a = torch.randn(rows, inner, device=device).to(dtype)
    b = torch.randn(inner, cols, device=device).to(dtype)
    best = float("inf")
    for _ in range(GEMM_REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * rows * inner * cols / max(best, 1e-9)


def copy_bytes_per_second(*, device: torch.device, megabytes: int = COPY_MEGABYTES) -> float:
    """Best-of-3 bandwidth of a large tensor copy (bytes read + written per second)."""
    with _disable_current_modes():
        src = torch.ones(megabytes * 2**18, device=device)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(GEMM_REPEATS):
            start = time.perf_counter()
            dst.copy_(src)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
    return 2.0 * src.numel() * src.element_size() / max(best, 1e-9)


class GemmRates:
    """Measured GEMM throughput per dtype and copy bandwidth, each measured on first use."""

    def __init__(self, *, rows: int, inner: int, cols: int, device: torch.device) -> None:
        self._dims = (rows, inner, cols)
        self._device = device
        self._rates: dict[torch.dtype, float] = {}
        self._bandwidth: float | None = None

    def rate(self, dtype: torch.dtype) -> float:
        if dtype not in self._rates:
            rows, inner, cols = self._dims
            self._rates[dtype] = gemm_flops_per_second(
                dtype, rows=rows, inner=inner, cols=cols, device=self._device
            )
        return self._rates[dtype]

    def bandwidth(self) -> float:
        if self._bandwidth is None:
            self._bandwidth = copy_bytes_per_second(device=self._device)
        return self._bandwidth

    def seconds(self, skipped: tuple[dict[torch.dtype, float], float]) -> float:
        """Modelled seconds of the elided work: FLOPs at the GEMM rate, bytes at the copy bandwidth."""
        flops_by_dtype, bytes_touched = skipped
        compute = sum(flops / self.rate(dtype) for dtype, flops in flops_by_dtype.items() if flops > 0)
        return compute + (bytes_touched / self.bandwidth() if bytes_touched > 0 else 0.0)
