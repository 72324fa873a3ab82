"""Measured peaks, like for like: allocator peaks teach the tensor terms (auto-downsizing after an
over-prediction, caution after an under-prediction); reserved and device peaks only their GPU, upward."""

from __future__ import annotations

from dataclasses import replace

from memfit.catalog import CATALOG
from memfit.memory import Shape, Strategy, memory_terms, shape_from_hf_config
from memfit.planner import MeasuredPeak, plan
from memfit.planner.measured import MeasuredDevice, PeakKind, peak_corrections
from planner_factories import LLAMA_1B_CONFIG, make_job, make_pool

SHAPE = Shape.of(shape_from_hf_config(LLAMA_1B_CONFIG, sequence_length=2048))
SPEC = make_job().hf(LLAMA_1B_CONFIG).batch(16).build()
POOLS = [make_pool("l40s", "l40s"), make_pool("a100-80", "a100-80")]


def predicted(s: Strategy) -> float:
    return memory_terms(SHAPE, s).peak_bytes(s.config.micro_batch_size, s.config.gradient_accumulation_steps)


def allocated(s: Strategy) -> float:
    return memory_terms(SHAPE, s).allocated_bytes(s.config.micro_batch_size, s.config.gradient_accumulation_steps)


def tensors(s: Strategy, ratio: float) -> MeasuredPeak:
    return MeasuredPeak(s, int(allocated(s) * ratio), PeakKind.ALLOCATED)


def test_factors_by_family_and_world_size_and_a_cautious_default() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    corrections = peak_corrections([tensors(s, 0.8)], SHAPE)
    assert abs(corrections.factor(s) - 0.8) < 1e-6
    other_world = replace(s, world_size=s.world_size * 2)
    assert abs(corrections.factor(other_world) - 0.8) < 1e-6  # same family, latest observation
    unrelated = s.with_config(optimizer8bit=not s.config.optimizer8bit)
    assert corrections.factor(unrelated) == 1.0  # over-predictions never shrink unmeasured configurations


def test_an_under_prediction_makes_every_prediction_cautious() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    corrections = peak_corrections([tensors(s, 1.3)], SHAPE)
    unrelated = s.with_config(optimizer8bit=not s.config.optimizer8bit)
    assert abs(corrections.default_factor - 1.3) < 1e-6 and abs(corrections.factor(unrelated) - 1.3) < 1e-6


def test_measured_lower_peak_lets_a_bigger_micro_batch_fit() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    again = plan(SPEC, pools=[make_pool(first.pool, first.pool)],
                 measured_peaks=[tensors(s, 0.5)], catalog=CATALOG).chosen
    assert again is not None and again.total_cost <= first.total_cost


def test_oom_at_capacity_moves_the_plan_off_that_configuration() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    oom = MeasuredPeak(first.strategy, first.usable_bytes)  # CUDA OOM: the peak is at least the capacity
    replanned = plan(SPEC, pools=POOLS, measured_peaks=[oom], catalog=CATALOG).chosen
    assert replanned is not None
    same = (replanned.pool, replanned.strategy) == (first.pool, first.strategy)
    assert not same and replanned.memory.peak_bytes * 1.1 <= replanned.usable_bytes


def test_the_tensor_ratio_compares_allocated_bytes_not_the_device_peak() -> None:
    """A CUDA max_memory_allocated equal to the predicted allocated bytes is a perfect prediction: it
    must not shrink the prediction (the old rule compared it with the whole peak, ratio < 1)."""
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    corrections = peak_corrections([tensors(s, 1.0)], SHAPE)
    assert abs(corrections.factor(s) - 1.0) < 1e-9 and corrections.device_factors == {}
    scaled = memory_terms(SHAPE, s).scaled(0.5)
    b, acc = s.config.micro_batch_size, s.config.gradient_accumulation_steps
    # The fixed CUDA/NCCL overhead is device-specific: a tensor correction leaves it alone.
    assert scaled.peak_bytes(b, acc) - scaled.fragmentation * scaled.allocated_bytes(b, acc) * 0.5 == \
        memory_terms(SHAPE, s).overhead_bytes


def test_device_peaks_apply_to_their_own_gpu_and_only_upward() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG).chosen
    assert first is not None
    s = first.strategy
    above = MeasuredPeak(s, int(predicted(s) * 1.2), PeakKind.DEVICE, gpu_product="NVIDIA-L40S")
    below = MeasuredPeak(s, int(predicted(s) * 0.5), PeakKind.DEVICE, gpu_product="NVIDIA-A100-SXM4-80GB")
    corrections = peak_corrections([above, below], SHAPE)
    assert abs(corrections.device_factor("NVIDIA-L40S") - 1.2) < 1e-3
    assert corrections.device_factor("NVIDIA-A100-SXM4-80GB") == 1.0  # below the prediction: never down
    assert corrections.device_factor("NVIDIA-L4") == 1.0  # another GPU learns nothing from it
    assert corrections.factor(s) == 1.0  # nor do the tensor terms
    replanned = plan(SPEC, pools=POOLS, measured_peaks=[above], catalog=CATALOG)
    notes = [n for n in replanned.notes if "measured on NVIDIA-L40S, peaks x 1.200 +0 MiB" in n]
    assert notes, replanned.notes


def test_device_terms_of_a_gpu_run_apply_to_its_own_product() -> None:
    first = plan(SPEC, pools=POOLS, catalog=CATALOG)
    assert first.chosen is not None and first.plan is not None
    product = first.chosen.product
    alloc = 10 * 2**30
    # A 1-GPU run: allocator gap 1.21 / 1.10 = 1.1x the default, and a 300 MiB context (default 544 MiB).
    run = MeasuredDevice(product, 1, alloc, int(alloc * 1.21), int(alloc * 1.21) + 300 * 2**20)
    corrections = peak_corrections([], SHAPE, devices=[run])
    terms = corrections.device_terms(product)
    assert abs(terms.factor - 1.1) < 1e-6 and terms.offset_bytes == -244 * 2**20
    assert corrections.device_terms("Some-Other-GPU").factor == 1.0
    # The same from a 2-GPU run may raise the overhead, never lower it (a 1-GPU plan has no NCCL part).
    two = MeasuredDevice(product, 2, alloc, int(alloc * 1.1), int(alloc * 1.1) + 300 * 2**20)
    assert abs(peak_corrections([], SHAPE, devices=[two]).device_terms(product).offset_bytes) < 1.0
    # A smaller gap than predicted lowers the tensor part only: factor < 1, plus the largest overhead
    # (context, cuBLAS, NCCL: 1056 MiB) times what the factor took off it, so every layout stays covered.
    tight = MeasuredDevice(product, 2, alloc, int(alloc * 1.045), int(alloc * 1.045) + 2**30)
    terms = peak_corrections([], SHAPE, devices=[tight]).device_terms(product)
    assert abs(terms.factor - 0.95) < 1e-6 and abs(terms.offset_bytes - 1056 * 2**20 * 0.05) < 2**10
    # The Plan shows the corrected peak against the GPU's own usable memory.
    again = plan(SPEC, pools=POOLS, measured_devices=[run], catalog=CATALOG)
    assert again.plan is not None and again.chosen is not None
    if again.chosen.product == product:
        assert again.plan.gpu_memory_bytes == first.plan.gpu_memory_bytes
        expected = again.chosen.memory.peak_bytes * 1.1 - 244 * 2**20
        assert abs(again.plan.memory.peak_bytes - expected) <= 2  # rounded up to whole bytes
