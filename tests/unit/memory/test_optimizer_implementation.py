"""optimizerImplementation's step temporaries (memory/temporaries.py): fused updates in place, foreach holds
one fp32 temporary of the local parameters, the per-tensor loop two of one tensor plus the previous
tensor's quotient; the library's default where none is chosen; DeepSpeed's step prologues (ZeRO-1/2 the
partition, ZeRO-3 one sub-group at a time). The CPU
truth of each is the techniques section of benchmarks/memory_accuracy.py."""

from __future__ import annotations

import pytest
from memfit.api.common import OptimizerImplementation
from memfit.memory import predict_memory
from memfit.memory.strategy import strategy_problem
from memfit.memory.temporaries import (
    DS_STEP_PROLOGUE_BYTES,
    DS_SUB_GROUP_ELEMENTS,
    implementation,
    phase_bytes,
)
from memory_factories import LLAMA2_7B, S, hf_shape

SHAPE = hf_shape(LLAMA2_7B, seq=1024)


def _scratch(builder: S) -> float:
    return phase_bytes(SHAPE, builder.build()).step_temporary_bytes


def test_fused_needs_nothing_foreach_the_parameters_and_the_loop_three_mlp_matrices() -> None:
    t, h, f = SHAPE.trainable, SHAPE.hidden, SHAPE.ffn
    assert _scratch(S().ddp().bf16().implementation("fused")) == 0.0
    assert _scratch(S().ddp().bf16().implementation("foreach")) == 4.0 * t
    # Llama's largest tensor is its embedding (2 x 4 B x V h); three adjacent MLP matrices are more only
    # when they outweigh two embeddings.
    loop = _scratch(S().ddp().bf16().implementation("for-loop"))
    assert loop == 4.0 * max(2 * SHAPE.largest_layer, 3 * h * f)


def test_the_default_is_the_librarys_for_the_device_and_engine() -> None:
    assert implementation(S().ddp().build()) == OptimizerImplementation.FOREACH
    assert implementation(S().fsdp().build()) == OptimizerImplementation.FOREACH
    assert implementation(S().deepspeed(2).build()) == OptimizerImplementation.FUSED  # DeepSpeed's FusedAdam
    for engine in (S().ddp(), S().fsdp(), S().deepspeed(2)):
        assert implementation(engine.device("cpu").build()) == OptimizerImplementation.FOR_LOOP


def test_sgd_with_momentum_steps_in_place_in_every_implementation() -> None:
    for name in ("fused", "foreach", "for-loop"):
        assert _scratch(S().ddp().bf16().sgd().implementation(name)) == 0.0


def test_deepspeed_zero2_step_prologue_bounds_a_fused_step() -> None:
    n = 8
    local = SHAPE.trainable / n
    fused = _scratch(S().deepspeed(2).bf16().world(n).implementation("fused"))
    assert fused == DS_STEP_PROLOGUE_BYTES * local
    assert _scratch(S().deepspeed(2).bf16().world(n).implementation("foreach")) == 4.0 * local
    # The flat fp32 partition is one tensor: the loop holds its square root and quotient.
    assert _scratch(S().deepspeed(2).bf16().world(n).implementation("for-loop")) == 8.0 * local


def test_zero3_step_prologue_is_the_16_bit_flat_copy_of_a_sub_group() -> None:
    n = 8
    local = SHAPE.trainable / n  # under one sub-group
    assert _scratch(S().deepspeed(3).bf16().world(n).implementation("fused")) == 2.0 * local
    assert _scratch(S().deepspeed(3).bf16().world(n).implementation("foreach")) == 4.0 * local
    # In fp32 the flat copy is the fp32 gradient itself: a fused step adds nothing.
    assert _scratch(S().deepspeed(3).fp32().world(n).implementation("fused")) == 0.0


def test_zero3_steps_one_sub_group_at_a_time() -> None:
    big, n = SHAPE, 2
    assert big.trainable / n > DS_SUB_GROUP_ELEMENTS  # 3.4 B local elements: four sub-groups
    terms = phase_bytes(big, S().deepspeed(3).bf16().world(n).implementation("fused").build())
    group = DS_SUB_GROUP_ELEMENTS + big.largest_layer / n  # closed at the tensor that reaches the size
    assert terms.step_gradient_bytes == pytest.approx(4.0 * group)
    assert terms.step_temporary_bytes == pytest.approx(2.0 * group)
    # ZeRO-2 steps its whole partition at once.
    zero2 = phase_bytes(big, S().deepspeed(2).bf16().world(n).implementation("fused").build())
    assert zero2.step_gradient_bytes == pytest.approx(4.0 * big.trainable / n)


def test_fsdp_shards_the_foreach_temporary() -> None:
    assert _scratch(S().fsdp(3).bf16().world(4).implementation("foreach")) == pytest.approx(4.0 * SHAPE.trainable / 4)


@pytest.mark.parametrize("builder", [S().ddp().bf16(), S().fsdp(3).bf16().world(4), S().deepspeed(1).bf16().world(4),
                                     S().ddp().fp32().ckpt("full"), S().deepspeed(2).fp32().world(2)])
def test_fused_never_predicts_more_than_foreach_or_the_loop(builder: S) -> None:
    peaks = {name: predict_memory(SHAPE, builder.implementation(name).build()).peak_bytes
             for name in ("fused", "foreach", "for-loop")}
    assert peaks["fused"] <= min(peaks["foreach"], peaks["for-loop"])


@pytest.mark.parametrize("builder,why", [
    (S().ddp().bf16().eight_bit(), "optimizer8bit is enabled"),
    (S().ddp().pure(), "bf16-pure"),
    (S().deepspeed(2).bf16().offload("cpu"), "offload is cpu"),
])
def test_an_optimizer_with_its_own_kernels_refuses_a_chosen_implementation(builder: S, why: str) -> None:
    assert strategy_problem(builder.build()) is None
    problem = strategy_problem(builder.implementation("fused").build())
    assert problem is not None and why in problem
