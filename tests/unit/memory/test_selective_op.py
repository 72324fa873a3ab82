"""selective-op checkpointing (memory/activations.py `matmul_outputs`): every block recomputed but its matmul
and attention outputs kept. The CPU truth of these terms is the techniques section of
benchmarks/memory_accuracy.py and tests/trainer/test_selective_op.py (the saved bytes, measured)."""

from __future__ import annotations

from memfit.api.common import Checkpointing, PeftMethod
from memfit.memory import predict_memory
from memfit.memory.activations import activation_terms, matmul_outputs
from memfit.memory.strategy import strategy_problem
from memfit.timing.step import recompute_factor
from memory_factories import LLAMA2_7B, S, hf_shape

SHAPE = hf_shape(LLAMA2_7B, seq=2048)


def test_a_block_keeps_its_input_and_its_matmul_outputs() -> None:
    h, f, kv, heads = SHAPE.hidden, SHAPE.ffn, SHAPE.kv_hidden, SHAPE.heads
    assert matmul_outputs(SHAPE, 2) == 2 * ((h + 2 * kv) + h + h + 2 * f + h) + 4 * heads
    op = activation_terms(SHAPE, S().fsdp(3).bf16().ckpt("selective-op").build())
    full = activation_terms(SHAPE, S().fsdp(3).bf16().ckpt("full").build())
    extra = (op.activation_bytes_per_sample - full.activation_bytes_per_sample) / SHAPE.tokens
    assert extra == SHAPE.layers * matmul_outputs(SHAPE, 2)


def test_it_sits_between_selective_and_full_in_memory_and_costs_no_gemm_recompute() -> None:
    peaks = {m: predict_memory(SHAPE, S().fsdp(3).bf16().world(8).ckpt(m).mbs(4).build()).activations_bytes
             for m in ("none", "selective", "selective-op", "full")}
    assert peaks["none"] > peaks["selective"] > peaks["selective-op"] > peaks["full"]
    assert recompute_factor(SHAPE, Checkpointing.SELECTIVE_OP) == 1.0 < recompute_factor(SHAPE, Checkpointing.SELECTIVE)


def test_it_trains_full_fine_tunes_only() -> None:
    problem = strategy_problem(S().ddp().bf16().ckpt("selective-op").build().with_config(peft=PeftMethod.LORA))
    assert problem is not None and "full fine-tune" in problem
