"""Step time: the roofline's op classes, recomputation, precision throughput, collectives and their
overlap, offload, learned factors."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing
from memfit.timing import GpuSpeed, estimate_step_seconds, flops_per_sample
from memfit.timing.step import BUS_EFFICIENCY, MIN_EXPOSED, recompute_factor, time_terms
from memory_factories import LLAMA2_7B, S, hf_shape

SHAPE = hf_shape(LLAMA2_7B, seq=4096)
A100 = GpuSpeed(bf16_tflops=312, fp16_tflops=312, fp32_tflops=19.5, tf32_tflops=156, intra_node_gbps=300,
                inter_node_gbits=400, hbm_gbps=2039, sm_count=108, matmul_efficiency=0.859)


def test_flops_per_sample_is_6n_per_token_plus_attention() -> None:
    tokens = 4096
    assert flops_per_sample(SHAPE) == 6 * SHAPE.parameters * tokens + 12 * 32 * tokens * tokens * 4096


def test_recompute_full_is_about_four_thirds_and_selective_less() -> None:
    full = recompute_factor(SHAPE, Checkpointing.FULL)
    selective = recompute_factor(SHAPE, Checkpointing.SELECTIVE)
    assert 1.25 < full < 4 / 3 + 0.01
    assert 1.0 < selective < full
    assert recompute_factor(SHAPE, Checkpointing.NONE) == 1.0


def test_fp32_runs_on_cuda_cores_and_tf32_on_tensor_cores() -> None:
    bf16 = estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().mbs(4).build(), A100)
    fp32 = estimate_step_seconds(SHAPE, S().deepspeed(3).fp32().mbs(4).build(), A100)
    tf32 = estimate_step_seconds(SHAPE, S().deepspeed(3).fp32().mbs(4).build(), A100, tf32=True)
    # GEMMs 16x slower on CUDA cores; the memory-bound ops only move twice the bytes.
    assert 10 < fp32.compute_seconds / bf16.compute_seconds < 312 / 19.5
    assert bf16.compute_seconds < tf32.compute_seconds < fp32.compute_seconds / 4


def test_a_measured_mfu_replaces_the_roofline() -> None:
    step = estimate_step_seconds(SHAPE, S().ddp().bf16().mbs(8).build(), A100, mfu=0.5)
    assert step.compute_seconds == pytest.approx(flops_per_sample(SHAPE) * 8 / (312e12 * 0.5))
    assert step.communication_seconds == 0 and step.offload_seconds == 0


def test_bigger_micro_batches_are_never_slower() -> None:
    times = [estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().world(8).mbs(b, 16 // b).build(),
                                   A100).step_seconds for b in (1, 2, 4, 8, 16)]
    assert times == sorted(times, reverse=True)


def test_zero3_moves_more_than_zero2_hides_it_behind_compute_and_pcie_is_slower_than_nvlink() -> None:
    pcie = GpuSpeed(bf16_tflops=312, fp16_tflops=312, fp32_tflops=19.5, intra_node_gbps=25, hbm_gbps=2039)
    z2_terms = time_terms(SHAPE, S().deepspeed(2).bf16().world(8).mbs(1, 1).build(), samples_per_gpu_step=1)
    z3_terms = time_terms(SHAPE, S().deepspeed(3).bf16().world(8).mbs(1, 1).build(), samples_per_gpu_step=1)
    assert z3_terms.per_micro_collective_bytes > z2_terms.per_micro_collective_bytes > 0
    assert z2_terms.exposed_step_collective_bytes > 0 == z3_terms.exposed_step_collective_bytes  # ZeRO-2's gather
    z3 = estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().world(8).mbs(1, 1).build(), A100)
    z3_pcie = estimate_step_seconds(SHAPE, S().deepspeed(3).bf16().world(8).mbs(1, 1).build(), pcie)
    assert z3_pcie.communication_seconds > z3.communication_seconds > 0


def test_ring_all_reduce_volume_over_the_intra_node_link_hidden_behind_the_backward() -> None:
    # ZeRO-1: one all-reduce of 16-bit gradients, 2(N-1)/N x 2 bytes x Ψ over 300 GB/s at the bus efficiency,
    # hidden behind the last micro-step's backward (2/3 of its compute) down to MIN_EXPOSED of it.
    step = estimate_step_seconds(SHAPE, S().deepspeed(1).bf16().world(8).mbs(1).build(), A100)
    comm = 2 * 7 / 8 * 2 * SHAPE.trainable / (300e9 * BUS_EFFICIENCY)
    assert step.communication_seconds == pytest.approx(max(comm - step.compute_seconds * 2 / 3, MIN_EXPOSED * comm))


def test_nodes_over_the_network_are_slower_than_nvlink_inside_one_node() -> None:
    inside = estimate_step_seconds(SHAPE, S().deepspeed(1).bf16().world(8, 8).build(), A100)
    across = estimate_step_seconds(SHAPE, S().deepspeed(1).bf16().world(8, 1).build(), A100)
    assert across.communication_seconds > inside.communication_seconds


def test_cpu_offload_adds_transfer_and_cpu_adam_time() -> None:
    plain = estimate_step_seconds(SHAPE, S().deepspeed(2).bf16().world(8).build(), A100)
    offloaded = estimate_step_seconds(SHAPE, S().deepspeed(2).bf16().world(8).offload("cpu").build(), A100)
    assert offloaded.offload_seconds > 0
    assert offloaded.step_seconds > plain.step_seconds
