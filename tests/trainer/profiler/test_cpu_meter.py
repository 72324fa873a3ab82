"""The CPU allocator meter: the counter starts at the model and returns to the model's states."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memfit_trainer.profiler.cpu_meter import CpuAllocatorMeter  # noqa: E402


def test_regions_report_peaks_relative_to_the_session_start() -> None:
    with CpuAllocatorMeter() as meter:
        model = torch.nn.Linear(256, 256)  # 65,792 floats
        with meter.region("build-grads"):
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        with meter.region("transient"):
            scratch = torch.empty(1 << 20, dtype=torch.uint8)
            del scratch
    params = sum(p.numel() * 4 for p in model.parameters())
    regions = meter.results()
    assert regions["build-grads"].start_allocated_bytes == params
    assert regions["build-grads"].end_allocated_bytes == 2 * params
    assert regions["transient"].peak_allocated_bytes == 2 * params + (1 << 20)
    assert regions["transient"].end_allocated_bytes == 2 * params
    assert regions["transient"].seconds >= 0


def test_threads_are_restored_and_regions_are_unique() -> None:
    threads = torch.get_num_threads()
    with CpuAllocatorMeter() as meter:
        assert torch.get_num_threads() == 1
        with meter.region("a"):
            pass
        with pytest.raises(ValueError, match="marked twice"), meter.region("a"):
            pass
    assert torch.get_num_threads() == threads
    with pytest.raises(RuntimeError):
        CpuAllocatorMeter().results()
