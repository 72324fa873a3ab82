"""The predictor: phases, breakdown sums, closed-form micro-batch, sharding, speed."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from memfit.memory import memory_terms, predict_memory
from memfit.memory.strategy import Strategy
from memory_factories import GIB, LLAMA2_7B, LLAMA32_1B, S, hf_shape

LLAMA_1B = hf_shape(LLAMA32_1B)


def test_breakdown_adds_up_to_the_peak() -> None:
    e = predict_memory(LLAMA_1B, S().deepspeed(2).bf16().world(4).ckpt("full").mbs(2, 8).build())
    parts = (e.parameters_bytes + e.gradients_bytes + e.optimizer_bytes + e.activations_bytes
             + e.temporaries_bytes + e.overhead_bytes)
    assert parts == e.peak_bytes
    assert e.allocated_bytes < e.peak_bytes
    assert e.to_breakdown().peak_bytes == e.peak_bytes


def test_accumulation_keeps_gradients_alive_with_the_activations() -> None:
    base = S().ddp().bf16().mbs(1).build()
    one = predict_memory(LLAMA_1B, base)
    accumulate = predict_memory(LLAMA_1B, base.with_config(gradient_accumulation_steps=4))
    assert accumulate.peak_bytes > one.peak_bytes
    assert accumulate.gradients_bytes == 4 * LLAMA_1B.trainable  # all fp32 gradients at the peak
    assert one.gradients_bytes < accumulate.gradients_bytes  # only the head's exist at the peak


def test_sharding_lowers_the_peak_stage_by_stage() -> None:
    shape = hf_shape(LLAMA2_7B, seq=4096)
    peaks = [predict_memory(shape, S().deepspeed(st).bf16().world(8).ckpt("full").build()).peak_bytes
             for st in range(4)]
    assert peaks == sorted(peaks, reverse=True)
    assert peaks[0] / GIB > 100 and peaks[3] / GIB < 25


def test_offload_needs_host_ram_and_frees_gpu_memory() -> None:
    shape = hf_shape(LLAMA2_7B, seq=4096)
    on_gpu = predict_memory(shape, S().deepspeed(3).bf16().world(8).ckpt("full").build())
    offloaded = predict_memory(shape, S().deepspeed(3).bf16().world(8).ckpt("full").offload("cpu").build())
    assert offloaded.peak_bytes < on_gpu.peak_bytes
    assert offloaded.host_bytes > 0 and on_gpu.host_bytes == 0


@pytest.mark.parametrize("accumulation_above_one", [False, True], ids=["accumulation 1", "accumulation >1"])
@pytest.mark.parametrize("budget_gib", [12, 20, 40, 80])
def test_closed_form_micro_batch_equals_search(budget_gib: int, accumulation_above_one: bool) -> None:
    terms = memory_terms(LLAMA_1B, S().fsdp(3).bf16().world(2).ckpt("selective").build())
    budget = budget_gib * GIB
    accumulation = 2 if accumulation_above_one else 1
    searched = max((b for b in range(1, 200) if terms.peak_bytes(b, accumulation) <= budget), default=0)
    assert terms.max_micro_batch(budget, accumulation_above_one=accumulation_above_one) == searched


def test_peak_grows_linearly_with_the_micro_batch() -> None:
    terms = memory_terms(LLAMA_1B, S().deepspeed(2).bf16().world(8).build())
    p1, p2, p3 = (terms.peak_bytes(b, 2) for b in (1, 2, 3))
    assert p2 - p1 == pytest.approx(p3 - p2)
    assert p2 - p1 == pytest.approx(terms.fragmentation * terms.per_sample_bytes)


def test_distributed_jobs_pay_for_nccl() -> None:
    single = predict_memory(LLAMA_1B, S().deepspeed(1).bf16().world(1).build())
    ddp2 = predict_memory(LLAMA_1B, S().deepspeed(0).bf16().world(2).build())
    single0 = predict_memory(LLAMA_1B, S().deepspeed(0).bf16().world(1).build())
    assert ddp2.overhead_bytes - single0.overhead_bytes == pytest.approx(512 * 1024**2, rel=0.01)
    assert single.overhead_bytes > 0


def test_one_prediction_takes_well_under_a_millisecond() -> None:
    strategy: Strategy = S().deepspeed(3).bf16().world(16).ckpt("full").mbs(4, 2).build()
    predict_memory(LLAMA_1B, strategy)
    n = 500
    start = time.perf_counter()
    for _ in range(n):
        predict_memory(LLAMA_1B, strategy)
    assert (time.perf_counter() - start) / n < 1e-3


def test_late_backward_moment_holds_most_gradients() -> None:
    # A first-token classifier (no vocabulary) with full checkpointing: the activations are small and
    # the peak is the last block's backward, with the other blocks' gradients already made.
    from memfit.memory import Shape
    from memory_factories import model_shape

    shape = Shape.of(model_shape(vocab=0))
    strategy = S().ddp().fp32().ckpt("full").build().with_config(micro_batch_size=1)
    estimate = predict_memory(shape, strategy)
    terms = memory_terms(shape, strategy)
    assert estimate.phase in ("backward", "step")
    assert terms.late_gradient_bytes > 0.5 * terms.held_gradient_bytes  # most gradients exist by then
    loss, first, last = terms.activation_moments(1)
    assert last.fixed_bytes > first.fixed_bytes >= loss.fixed_bytes  # the fixed bytes grow through backward
    assert last.per_sample_bytes < first.per_sample_bytes  # while the saved activations shrink


def test_a_cpu_step_has_no_cuda_overhead() -> None:
    from memfit.memory import Device

    on_cpu = replace(S().ddp().bf16().mbs(2).build(), device=Device.CPU)
    estimate = predict_memory(LLAMA_1B, on_cpu)
    assert estimate.peak_bytes == estimate.allocated_bytes  # no context, cuBLAS, NCCL or fragmentation
    assert predict_memory(LLAMA_1B, replace(on_cpu, device=Device.CUDA)).peak_bytes > estimate.peak_bytes
