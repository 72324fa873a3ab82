"""Model states: the ZeRO paper's numbers, DeepSpeed's byte counts, 8-bit state, offload."""

from __future__ import annotations

import pytest
from memfit.api.job import OptimizerKind
from memfit.memory import Shape, zero_model_state_bytes
from memfit.memory.states import HOST_BUFFER_FACTOR, model_states, optimizer_state_bytes_per_param
from memory_factories import S, model_shape

# ZeRO paper (Rajbhandari et al. 2020), Figure 1: 7.5B parameters, N_d = 64, K = 12.
ZERO_PAPER_7_5B = {"stage 0 (DDP)": (0, 120.0), "stage 1 (P_os)": (1, 31.4), "stage 2 (P_os+g)": (2, 16.6),
                   "stage 3 (P_os+g+p)": (3, 1.9)}


@pytest.mark.parametrize(("stage", "gigabytes"), ZERO_PAPER_7_5B.values(), ids=ZERO_PAPER_7_5B.keys())
def test_zero_paper_example(stage: int, gigabytes: float) -> None:
    assert zero_model_state_bytes(parameters=7.5e9, stage=stage, dp_degree=64) / 1e9 == pytest.approx(
        gigabytes, abs=0.05
    )


# No tensors below bitsandbytes' 4096-element threshold: hidden >= 4096.
BIG = Shape.of(model_shape(parameters=7_000_000_000, hidden=4096, heads=32, ffn_hidden=16384, layers=32))
P = 7_000_000_000

# (strategy, params, grads, optimizer) in bytes per GPU.
STATES = {
    "fp32 DDP: 4 + 4 + 8 = 16 B/param": (S().ddp().fp32().build(), 4 * P, 4 * P, 8 * P),
    "DDP autocast keeps fp32 states": (S().ddp().bf16().build(), 4 * P, 4 * P, 8 * P),
    # DeepSpeed: gradients are what the optimizer step holds (the fp32 partition); the 16-bit
    # gradients of backward are phase terms (temporaries.py). Estimator: 2Ψ + (4 + 12 + 2)Ψ/N.
    "DeepSpeed bf16 stage 0: 2 + fp32 grads 4 + (12)": (S().deepspeed(0).bf16().build(), 2 * P, 4 * P, 12 * P),
    "DeepSpeed bf16 ZeRO-1 on 8": (S().deepspeed(1).bf16().world(8).build(), 2 * P, 4 * P / 8, 12 * P / 8),
    "DeepSpeed bf16 ZeRO-2 on 8": (S().deepspeed(2).bf16().world(8).build(), 2 * P, 4 * P / 8, 12 * P / 8),
    "DeepSpeed bf16 ZeRO-3 on 8": (S().deepspeed(3).bf16().world(8).build(), 2 * P / 8, 4 * P / 8, 12 * P / 8),
    "DeepSpeed fp32 ZeRO-2 on 4 clones an fp32 partition": (
        S().deepspeed(2).fp32().world(4).build(), 4 * P, 4 * P / 4, 12 * P / 4),
    "DeepSpeed fp32 without ZeRO steps the model's parameters": (
        S().deepspeed(0).fp32().build(), 4 * P, 4 * P, 8 * P),
    "FSDP full shard on 16: 16/N": (S().fsdp(3).bf16().world(16).build(), 4 * P / 16, 4 * P / 16, 8 * P / 16),
    "8-bit AdamW: 2 x (1 + 4/256) = 2.03 B/param": (S().ddp().bf16().eight_bit().build(), 4 * P, 4 * P, 2.03125 * P),
    "SGD momentum: 4 B/param": (S().ddp().fp32().sgd().build(), 4 * P, 4 * P, 4 * P),
    "8-bit SGD: 1.016 B/param": (S().ddp().fp32().sgd().eight_bit().build(), 4 * P, 4 * P, 1.015625 * P),
}


@pytest.mark.parametrize(("strategy", "params", "grads", "optim"), STATES.values(), ids=STATES.keys())
def test_model_states(strategy: object, params: float, grads: float, optim: float) -> None:
    states = model_states(BIG, strategy)  # type: ignore[arg-type]
    assert (states.parameters_bytes, states.gradients_bytes, states.optimizer_bytes) == pytest.approx(
        (params, grads, optim)
    )
    assert (states.host_bytes, states.nvme_bytes) == (0, 0)


def test_eight_bit_adam_is_2_03_bytes_per_parameter() -> None:
    assert optimizer_state_bytes_per_param(OptimizerKind.ADAMW, eight_bit=True) == pytest.approx(2.03, abs=0.005)
    assert optimizer_state_bytes_per_param(OptimizerKind.ADAM, eight_bit=False) == 8


def test_small_tensors_keep_32_bit_state() -> None:
    small = Shape.of(model_shape(parameters=100_000_000, hidden=1024))  # norms/biases < 4096 elements
    optim = model_states(small, S().ddp().bf16().eight_bit().build()).optimizer_bytes
    assert optim > 2.03125 * 100_000_000
    assert optim == pytest.approx(2.03125 * (1e8 - small.small_trainable) + 8 * small.small_trainable)


def test_zero_offload_moves_the_optimizer_to_host_ram_with_deepspeeds_buffer_factor() -> None:
    states = model_states(BIG, S().deepspeed(2).bf16().world(4).offload("cpu").build())
    assert (states.parameters_bytes, states.gradients_bytes, states.optimizer_bytes) == (2 * P, 0, 0)
    assert states.host_bytes == pytest.approx(16 * P / 4 * HOST_BUFFER_FACTOR)


def test_zero3_offload_moves_parameters_too_as_the_estimator_18_psi() -> None:
    states = model_states(BIG, S().deepspeed(3).bf16().world(8).offload("cpu").build())
    assert states.parameters_bytes == 0
    # DeepSpeed's estimate_zero3 (offload params + optimizer): cpu = 18Ψ x 1.5 per node of 8 GPUs.
    assert states.host_bytes * 8 == pytest.approx(18 * P * 1.5)


def test_nvme_offload_puts_parameters_and_optimizer_on_nvme() -> None:
    states = model_states(BIG, S().deepspeed(3).bf16().world(8).offload("nvme").build())
    assert states.nvme_bytes == pytest.approx((2 * P + 12 * P) / 8)
    assert states.host_bytes > 4 * P / 8  # fp32 gradient partition and swap buffers stay in RAM


def test_fsdp_cpu_offload_keeps_no_states_on_the_gpu() -> None:
    states = model_states(BIG, S().fsdp(3).bf16().world(8).offload("cpu").build())
    assert (states.parameters_bytes, states.gradients_bytes, states.optimizer_bytes) == (0, 0, 0)
    assert states.host_bytes == pytest.approx(16 * P / 8 * HOST_BUFFER_FACTOR)
