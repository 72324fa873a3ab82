"""The CPU allocator meter, both views: the counter starts at the model and returns to the model's states."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memfit_trainer.meters.cpu import CpuAllocatorMeter  # noqa: E402


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


def test_garbage_of_an_earlier_session_does_not_lower_the_next_one() -> None:
    """A tensor allocated in one session and left in a reference cycle is collected before the next session
    starts, not inside it (where its free would pull the counter below the baseline)."""
    import gc

    class Cycle:
        def __init__(self) -> None:
            self.me, self.data = self, torch.empty(4 << 20, dtype=torch.uint8)

    gc.disable()
    try:
        with CpuAllocatorMeter():
            Cycle()  # unreachable at once, freed only by the collector
        with CpuAllocatorMeter() as meter, meter.region("step"):
            scratch = torch.empty(1 << 20, dtype=torch.uint8)
            gc.collect()  # where the collector would otherwise free the cycle: inside the step
            del scratch
    finally:
        gc.enable()
    step = meter.results()["step"]
    assert (step.start_allocated_bytes, step.peak_allocated_bytes, step.end_allocated_bytes) == (0, 1 << 20, 0)


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


def test_steps_report_the_counter_of_each_cycle() -> None:
    meter = CpuAllocatorMeter()
    meter.start()
    try:
        model = torch.nn.Linear(256, 256)
        params = sum(p.numel() * 4 for p in model.parameters())
        setup = meter.end_step()
        scratch = torch.empty(1 << 20, dtype=torch.uint8)
        del scratch
        step = meter.end_step()
    finally:
        meter.stop()
    assert meter.name == "cpu-allocator-profiler"
    base = setup.step_start_bytes  # the counter is process-wide: tensors of earlier tests count
    assert (setup.allocated_bytes, setup.peak_bytes) == (base + params, base + params)
    assert (step.step_start_bytes, step.allocated_bytes) == (base + params, base + params)
    assert step.transient_peak_bytes == 1 << 20
    assert meter.run_peak_bytes == base + params + (1 << 20)
    assert step.reserved_bytes > 0  # the process RSS
