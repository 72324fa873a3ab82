"""The roofline compute model: op classes, GEMM size, kernel launches, GPU generations, LoRA."""

from __future__ import annotations

from dataclasses import replace

import pytest
from memfit.catalog import CATALOG
from memfit.planner.offers import Offer, catalog_pool, resolve_offer
from memfit.timing import GpuSpeed, estimate_step_seconds, flops_per_sample
from memfit.timing.block_work import block_work, counted_flops_per_sample
from memfit.timing.roofline import (
    LAUNCH_SECONDS,
    Gemm,
    GpuRates,
    gemm_seconds,
    micro_step_seconds,
    wave_efficiency,
)
from memory_factories import GPT2, LLAMA2_7B, LLAMA32_1B, S, hf_shape


def speed(key: str) -> GpuSpeed:
    gpu = CATALOG.find(key)
    assert gpu is not None
    offer = resolve_offer(catalog_pool(gpu), catalog=CATALOG)
    assert isinstance(offer, Offer)
    return offer.speed


A100, H100 = speed("a100-80"), speed("h100-80")
RATES = GpuRates(peak_flops=312e12, hbm_bytes_per_s=2039e9, sm_count=108, matmul_efficiency=0.859,
                 flash_attention=True)


def test_wave_efficiency_grows_with_the_gemm_and_stays_below_one() -> None:
    values = [wave_efficiency(m, 4096, 108) for m in (128, 512, 2048, 8192, 65536)]
    assert values == sorted(values) and 0 < values[0] < 0.5 and values[-1] < 1


def test_a_one_token_gemm_pays_at_least_its_weights_a_large_one_its_arithmetic() -> None:
    gemm = Gemm(4096, 4096, 1.0, 0.0)
    weights_read = 2 * 4096 * 4096 / (2039e9 * 0.8)
    assert gemm_seconds(1, gemm, RATES, 2) >= weights_read
    large = gemm_seconds(16384, gemm, RATES, 2)
    assert large / 16384 < gemm_seconds(1, gemm, RATES, 2) / 100  # per token, a hundred times cheaper
    assert large == pytest.approx(2 * 16384 * 4096 * 4096 / (312e12 * 0.859 * 0.85), rel=0.05)


def test_a_tiny_model_at_micro_batch_one_waits_on_kernel_launches() -> None:
    shape = hf_shape(GPT2, seq=64)
    work = block_work(shape, S().ddp().bf16().build())
    assert micro_step_seconds(work, 64, RATES) == pytest.approx(work.kernels * LAUNCH_SECONDS)
    assert micro_step_seconds(work, 64 * 512, RATES) > work.kernels * LAUNCH_SECONDS


def test_the_input_embedding_is_a_lookup_not_a_gemm() -> None:
    shape = hf_shape(LLAMA2_7B, seq=4096)
    embedding = shape.vocab * shape.hidden
    attention = 12 * shape.layers * shape.tokens * shape.hidden
    gemm_flops = counted_flops_per_sample(shape) / shape.tokens - attention
    # 6 x (parameters - embedding) per token; the untied head is a GEMM, the input embedding is not.
    assert gemm_flops == pytest.approx(6 * (shape.parameters - embedding), rel=0.01)


def test_a_profile_counting_the_same_flops_leaves_the_roofline_as_it_is() -> None:
    shape = hf_shape(LLAMA32_1B, seq=2048)
    strategy = S().ddp().bf16().mbs(4).build()
    plain = estimate_step_seconds(shape, strategy, A100)
    same = estimate_step_seconds(shape, strategy, A100, flops_per_sample_override=counted_flops_per_sample(shape))
    double = estimate_step_seconds(shape, strategy, A100,
                                   flops_per_sample_override=2 * counted_flops_per_sample(shape))
    assert same.compute_seconds == pytest.approx(plain.compute_seconds)
    assert double.compute_seconds > 1.5 * plain.compute_seconds


def test_without_flash_kernels_attention_runs_at_most_at_flash_speed() -> None:
    """V100 has no FlashAttention-2: SDPA's memory-efficient kernel is slower per FLOP, never faster."""
    shape = hf_shape(LLAMA32_1B, seq=8192)
    strategy = S().ddp().bf16().mbs(1).build()
    flash = estimate_step_seconds(shape, strategy, A100).compute_seconds
    no_flash = estimate_step_seconds(shape, strategy, replace(A100, flash_attention=False)).compute_seconds
    assert no_flash > flash


def test_h100_over_a100_lies_between_the_bandwidth_and_the_peak_ratios() -> None:
    shape = hf_shape(LLAMA2_7B, seq=4096)
    strategy = S().fsdp(3).bf16().world(8).mbs(2, 4).build()
    ratio = estimate_step_seconds(shape, strategy, A100).step_seconds / estimate_step_seconds(
        shape, strategy, H100).step_seconds
    assert 3350 / 2039 < ratio < 989 / 312


def test_a_smaller_micro_batch_costs_a_little_not_half() -> None:
    shape = hf_shape(LLAMA32_1B, seq=2048)
    by_micro = {b: estimate_step_seconds(shape, S().ddp().bf16().mbs(b, 16 // b).build(), A100).step_seconds
                for b in (1, 4)}
    assert 1.02 < by_micro[1] / by_micro[4] < 1.35


def test_bf16_training_reaches_a_plausible_share_of_the_peak() -> None:
    """Model FLOPs utilisation of a 7B model on 8 A100s lands in the range large trainers report (40-65 %)."""
    shape = hf_shape(LLAMA2_7B, seq=4096)
    step = estimate_step_seconds(shape, S().fsdp(3).bf16().world(8).mbs(2, 4).build(), A100)
    mfu = flops_per_sample(shape) * 8 / step.step_seconds / 312e12
    assert 0.40 < mfu < 0.65


def test_checkpointing_costs_about_a_third_more_compute() -> None:
    shape = hf_shape(LLAMA2_7B, seq=4096)
    plain = estimate_step_seconds(shape, S().fsdp(3).bf16().world(8).mbs(2, 4).build(), A100)
    full = estimate_step_seconds(shape, S().fsdp(3).bf16().world(8).ckpt("full").mbs(2, 4).build(), A100)
    assert 1.2 < full.compute_seconds / plain.compute_seconds < 1.4
