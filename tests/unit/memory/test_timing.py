"""Step time: 6N FLOPs, recomputation, precision throughput, collectives, offload."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing
from memfit.memory import GpuSpeed, estimate_step_seconds, flops_per_sample
from memfit.memory.timing import recompute_factor
from memory_factories import LLAMA2_7B, S, hf_shape

SHAPE = hf_shape(LLAMA2_7B, seq=4096)
A100 = GpuSpeed(bf16_tflops=312, fp16_tflops=312, fp32_tflops=19.5, intra_node_gbps=300, inter_node_gbits=400)


def test_flops_per_sample_is_6n_per_token_plus_attention() -> None:
    tokens = 4096
    assert flops_per_sample(SHAPE) == 6 * SHAPE.parameters * tokens + 12 * 32 * tokens * tokens * 4096


def test_recompute_full_is_about_four_thirds_and_selective_less() -> None:
    full = recompute_factor(SHAPE, Checkpointing.FULL)
    selective = recompute_factor(SHAPE, Checkpointing.SELECTIVE)
    assert 1.25 < full < 4 / 3 + 0.01
    assert 1.0 < selective < full
    assert recompute_factor(SHAPE, Checkpointing.NONE) == 1.0


def test_fp32_runs_on_cuda_cores_sixteen_times_slower_on_a100() -> None:
    bf16 = estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().mbs(4).build(), A100)
    fp32 = estimate_step_seconds(SHAPE, S().deepspeed(3).fp32().mbs(4).build(), A100)
    assert fp32.compute_seconds / bf16.compute_seconds == pytest.approx(312 / 19.5)


def test_compute_time_matches_flops_over_efficiency() -> None:
    step = estimate_step_seconds(SHAPE, S().ddp().bf16().mbs(8).build(), A100, mfu=0.5)
    tokens = 8 * 4096
    expected = flops_per_sample(SHAPE) * 8 / (312e12 * 0.5 * tokens / (tokens + 512))
    assert step.compute_seconds == pytest.approx(expected)
    assert step.communication_seconds == 0 and step.offload_seconds == 0


def test_bigger_micro_batches_are_never_slower() -> None:
    times = [estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().world(8).mbs(b, 16 // b).build(),
                                   A100).step_seconds for b in (1, 2, 4, 8, 16)]
    assert times == sorted(times, reverse=True)


def test_zero3_communicates_more_than_zero2_and_pcie_more_slowly_than_nvlink() -> None:
    pcie = GpuSpeed(bf16_tflops=312, fp16_tflops=312, fp32_tflops=19.5, intra_node_gbps=25)
    z2 = estimate_step_seconds(SHAPE, S().deepspeed(2).bf16().world(8).mbs(1, 1).build(), A100)
    z3 = estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().world(8).mbs(1, 1).build(), A100)
    z3_pcie = estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().world(8).mbs(1, 1).build(), pcie)
    assert z3.communication_seconds > z2.communication_seconds > 0
    assert z3_pcie.communication_seconds > z3.communication_seconds


def test_ring_all_reduce_volume_over_the_intra_node_link() -> None:
    # ZeRO-1: one all-reduce of 16-bit gradients, 2(N-1)/N x 2 bytes x Ψ over 300 GB/s, half hidden.
    step = estimate_step_seconds(SHAPE, S().deepspeed(1).bf16().world(8).mbs(1).build(), A100)
    comm = 2 * 7 / 8 * 2 * SHAPE.trainable / 300e9
    assert step.communication_seconds == pytest.approx(comm - 0.5 * min(comm, step.compute_seconds))


def test_nodes_over_the_network_are_slower_than_nvlink_inside_one_node() -> None:
    inside = estimate_step_seconds(SHAPE, S().deepspeed(1).bf16().world(8, 8).build(), A100)
    across = estimate_step_seconds(SHAPE, S().deepspeed(1).bf16().world(8, 1).build(), A100)
    assert across.communication_seconds > inside.communication_seconds


def test_cpu_offload_adds_transfer_and_cpu_adam_time() -> None:
    plain = estimate_step_seconds(SHAPE, S().deepspeed(2).bf16().world(8).build(), A100)
    offloaded = estimate_step_seconds(SHAPE, S().deepspeed(2).bf16().world(8).offload("cpu").build(), A100)
    assert offloaded.offload_seconds > 0
    assert offloaded.step_seconds > plain.step_seconds
