"""Checkpoint writes: the bytes the busiest node writes per checkpoint, and the seconds at its bandwidth."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, Engine, Offload, PeftMethod, Precision
from memfit.api.job import OptimizerKind
from memfit.api.training_config import TrainingConfig
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy
from memfit.planner.checkpoint_writes import DEFAULT_CHECKPOINT_WRITE_GBPS, checkpoint_bytes, write_seconds

BILLION = 1_000_000_000


def one_billion(*, buffers: int = 0) -> Shape:
    """A model of exactly 1e9 parameters, all trainable, none in small tensors."""
    return Shape(family="gpt", parameters=BILLION, trainable=BILLION, small_trainable=0, largest_layer=1,
                 block_parameters=1, root_parameters=1, buffer_bytes=buffers, layers=10, hidden=1, heads=1,
                 kv_hidden=1, ffn=1, vocab=1, tokens=1, gated_mlp=False, rms_norm=False, flash_attention=False,
                 dropout=False, separate_qkv=False)


def strategy(engine: Engine, stage: int, precision: Precision, *, world: int, per_node: int = 1,
             eight_bit: bool = False, peft: PeftMethod = PeftMethod.NONE) -> Strategy:
    config = TrainingConfig.model_construct(
        engine=engine, zero_stage=stage, precision=precision, activation_checkpointing=Checkpointing.NONE,
        offload=Offload.NONE, optimizer8bit=eight_bit, micro_batch_size=1, gradient_accumulation_steps=1, peft=peft)
    return Strategy(config, OptimizerKind.ADAMW, world, per_node)


CASES = {
    # name: (strategy, trainable, bytes the busiest node writes)
    "DDP: fp32 weights 4 + Adam 8 B/param, written once": (
        strategy(Engine.DDP, 0, Precision.BF16, world=1), BILLION, 12 * BILLION),
    "DDP on 2 nodes: replicated, still all from one node": (
        strategy(Engine.DDP, 0, Precision.BF16, world=2), BILLION, 12 * BILLION),
    "FSDP on 4 nodes: every node writes a quarter": (
        strategy(Engine.FSDP, 3, Precision.BF16, world=4), BILLION, 3 * BILLION),
    "FSDP on 2 nodes of 4 GPUs: halves": (
        strategy(Engine.FSDP, 3, Precision.BF16, world=8, per_node=4), BILLION, 6 * BILLION),
    "FSDP 8-bit Adam: 2 x (1 + 4/256) B/param of state": (
        strategy(Engine.FSDP, 3, Precision.BF16, world=1, eight_bit=True), BILLION, int(6.03125 * BILLION)),
    "ZeRO-2 bf16 on 2 nodes: 16-bit weights once, fp32 master + Adam sharded": (
        strategy(Engine.DEEPSPEED, 2, Precision.BF16, world=2), BILLION, 2 * BILLION + 6 * BILLION),
    "ZeRO-3 bf16 on 2 nodes: everything sharded": (
        strategy(Engine.DEEPSPEED, 3, Precision.BF16, world=2), BILLION, 7 * BILLION),
    "ZeRO-0 fp32: the model's own weights, no master copy": (
        strategy(Engine.DEEPSPEED, 0, Precision.FP32, world=1), BILLION, 12 * BILLION),
    "LoRA under DDP: only the adapters and their state": (
        strategy(Engine.DDP, 0, Precision.BF16, world=1, peft=PeftMethod.LORA), 10_000_000, 120_000_000),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bytes_the_busiest_node_writes(case: str) -> None:
    s, trainable, expected = CASES[case]
    assert checkpoint_bytes(one_billion(), s, trainable=trainable).per_node(s.nodes) == pytest.approx(expected)


def test_buffers_are_written_with_the_weights() -> None:
    s = strategy(Engine.DDP, 0, Precision.BF16, world=1)
    assert checkpoint_bytes(one_billion(buffers=1000), s, trainable=BILLION).per_node(1) == 12 * BILLION + 1000


def test_write_seconds_are_bytes_over_the_bandwidth() -> None:
    assert write_seconds(12 * BILLION, write_gbps=DEFAULT_CHECKPOINT_WRITE_GBPS) == pytest.approx(96.0)
    assert write_seconds(12 * BILLION, write_gbps=1.0) == pytest.approx(12.0)
    # The default is an EBS gp3 volume's baseline, 125 MiB/s, rounded down.
    assert DEFAULT_CHECKPOINT_WRITE_GBPS * 1e9 <= 125 * 2**20
