"""TrainingConfig: one description, one key, embedded inline in Plan and PlanSummary and held by Strategy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories import make_plan
from memfit.api.common import Checkpointing, Engine, Offload, OptimizerImplementation, PeftMethod, Precision
from memfit.api.job import PlanSummary
from memfit.api.plan import Plan
from memfit.api.training_config import (
    PLAIN_FP32_DDP,
    TrainingConfig,
    accumulation_steps,
    global_batch,
    samples_per_gpu,
)
from memfit.memory import Strategy


def config(**overrides: Any) -> TrainingConfig:
    return PLAIN_FP32_DDP.model_copy(update=overrides)


DESCRIBE = {
    "plain": (config(), "DDP fp32 mbs 1x1", "DDP, fp32"),
    "zero-2 everything": (
        config(engine=Engine.DEEPSPEED, zero_stage=2, precision=Precision.BF16,
               activation_checkpointing=Checkpointing.FULL, offload=Offload.CPU, micro_batch_size=2,
               gradient_accumulation_steps=8),
        "ZeRO-2 bf16 ckpt-full offload-cpu mbs 2x8",
        "ZeRO-2, bf16, full checkpointing, CPU offload",
    ),
    "fsdp full shard 8-bit": (
        config(engine=Engine.FSDP, zero_stage=3, precision=Precision.FP16, optimizer8bit=True),
        "FSDP-full-shard fp16 8-bit-optim mbs 1x1",
        "FSDP full shard, fp16, 8-bit optimizer",
    ),
    "fsdp grad-op selective": (
        config(engine=Engine.FSDP, zero_stage=2, activation_checkpointing=Checkpointing.SELECTIVE),
        "FSDP-grad-op fp32 ckpt-selective mbs 1x1",
        "FSDP grad-op shard, fp32, selective checkpointing",
    ),
    "zero-3 nvme": (
        config(engine=Engine.DEEPSPEED, zero_stage=3, offload=Offload.NVME),
        "ZeRO-3 fp32 offload-nvme mbs 1x1",
        "ZeRO-3, fp32, NVMe offload",
    ),
}


@pytest.mark.parametrize(("value", "short", "words"), DESCRIBE.values(), ids=DESCRIBE.keys())
def test_describe_short_and_in_words(value: TrainingConfig, short: str, words: str) -> None:
    assert value.describe() == short
    assert value.describe(words=True) == words
    assert value.describe(batch=False) == short.rsplit(" mbs ", 1)[0]


def test_key_ignores_the_batch_split_only() -> None:
    base = config(engine=Engine.DEEPSPEED, zero_stage=2, precision=Precision.BF16)
    assert base.key() == (Engine.DEEPSPEED, 2, Precision.BF16, Checkpointing.NONE, Offload.NONE, False,
                          PeftMethod.NONE, False, False, None, False)
    assert config(**{**dict(base), "micro_batch_size": 4, "gradient_accumulation_steps": 2}).key() == base.key()
    changed = {"zero_stage": 3, "precision": Precision.FP16, "activation_checkpointing": Checkpointing.FULL,
               "offload": Offload.CPU, "optimizer8bit": True, "engine": Engine.FSDP, "peft": PeftMethod.LORA,
               "optimizer_implementation": OptimizerImplementation.FUSED, "activation_offload": True}
    for name, value in changed.items():
        assert base.model_copy(update={name: value}).key() != base.key(), name


def test_plan_embeds_it_inline_and_round_trips_through_json() -> None:
    plan = make_plan()
    wire = json.loads(json.dumps(plan.to_wire()))
    # Flat on the wire: the trainer reads the same keys as before TrainingConfig existed.
    assert {k: wire[k] for k in ("engine", "zeroStage", "precision", "activationCheckpointing", "offload",
                                 "optimizer8bit", "microBatchSize", "gradientAccumulationSteps")} == {
        "engine": "deepspeed", "zeroStage": 2, "precision": "bf16", "activationCheckpointing": "full",
        "offload": "none", "optimizer8bit": True, "microBatchSize": 2, "gradientAccumulationSteps": 4,
    }
    assert "config" not in wire
    again = Plan.model_validate_json(json.dumps(wire))
    assert again == plan
    assert again.training_config() == plan.training_config()
    bare = again.training_config()
    assert type(bare) is TrainingConfig
    assert bare.to_wire() == {k: wire[k] for k in bare.to_wire()}
    assert TrainingConfig.model_validate(bare.to_wire()) == bare


def test_plan_and_strategy_share_describe_and_key() -> None:
    plan = make_plan()
    strategy = Strategy(config=plan.training_config(), world_size=plan.world_size, gpus_per_node=plan.gpus_per_node)
    assert plan.describe() == f"8xNVIDIA-L4 {strategy.config.describe()}"
    assert plan.describe() == "8xNVIDIA-L4 ZeRO-2 bf16 ckpt-full 8-bit-optim mbs 2x4"
    assert plan.key() == strategy.config.key()


def test_plan_summary_embeds_the_same_fields() -> None:
    plan = make_plan()
    summary = PlanSummary(
        **dict(plan.training_config()), node_pool=plan.node_pool, nodes=plan.nodes, gpus=plan.world_size,
        gpu_product=plan.gpu_product, predicted_peak_bytes=6, predicted_peak="0.0Gi", gpu_memory_bytes=1,
        cost_per_hour=1.0, cost_per_hour_text="$1.00", estimated_hours=1.0, estimated_cost=1.0,
    )
    assert summary.training_config() == plan.training_config()
    assert PlanSummary.model_validate(summary.to_wire()) == summary
    assert summary.to_wire()["zeroStage"] == 2


def test_values_are_validated_and_frozen() -> None:
    with pytest.raises(ValueError, match="zeroStage"):
        TrainingConfig.model_validate({**PLAIN_FP32_DDP.to_wire(), "zeroStage": 4})
    with pytest.raises(ValueError, match="microBatchSize"):
        TrainingConfig.model_validate({**PLAIN_FP32_DDP.to_wire(), "microBatchSize": 0})
    with pytest.raises(ValueError):
        PLAIN_FP32_DDP.engine = Engine.FSDP  # type: ignore[misc]


def test_describe_names_lora_and_qlora_first() -> None:
    lora = config(engine=Engine.DDP, zero_stage=0, precision=Precision.BF16).model_copy(update={"peft": PeftMethod.QLORA})
    assert lora.describe() == "QLoRA DDP bf16 mbs 1x1"
    assert lora.describe(words=True) == "QLoRA, DDP, bf16"


@pytest.mark.parametrize(
    ("global_batch_size", "world", "micro", "per_gpu", "accumulation"),
    [
        pytest.param(256, 8, 4, 32, 8, id="splits evenly"),
        pytest.param(256, 3, 1, None, None, id="not divisible by the ranks"),
        pytest.param(24, 4, 4, 6, None, id="micro-batch does not divide the per-GPU samples"),
        pytest.param(8, 16, 1, None, None, id="more ranks than samples"),
    ],
)  # fmt: skip
def test_the_one_global_batch_rule(global_batch_size: int, world: int, micro: int, per_gpu: int | None,
                                   accumulation: int | None) -> None:
    assert samples_per_gpu(global_batch_size, world) == per_gpu
    assert accumulation_steps(global_batch_size, world_size=world, micro_batch_size=micro) == accumulation
    if accumulation is not None:
        assert global_batch(micro_batch_size=micro, accumulation_steps=accumulation, world_size=world) == global_batch_size
