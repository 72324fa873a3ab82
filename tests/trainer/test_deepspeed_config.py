"""The DeepSpeed config derived from a Plan, checked against DeepSpeed's own parser."""

from __future__ import annotations

from typing import Any

import pytest
from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config
from trainer_support import PlanBuilder, make_plan


def parsed(config: dict[str, Any]) -> Any:
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(config)


CASES = {
    "zero0 fp32": make_plan().deepspeed(0),
    "zero1 bf16 cpu offload": make_plan().deepspeed(1).bf16().offload("cpu"),
    "zero2 fp16 8-bit": make_plan().deepspeed(2).precision("fp16").eight_bit(),
    "zero3 bf16 cpu offload": make_plan().deepspeed(3).bf16().offload("cpu"),
    "zero3 fp16 nvme": make_plan().deepspeed(3).precision("fp16").offload("nvme", "/nvme"),
    "zero2 sgd": make_plan().deepspeed(2).optimizer("sgd"),
    "zero3 adam": make_plan().deepspeed(3).optimizer("adam"),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("cuda", [True, False], ids=["gpu", "cpu"])
def test_deepspeed_accepts_the_config(name: str, cuda: bool, world1: Any) -> None:
    plan = CASES[name].batch(2, 4).build()
    config = build_deepspeed_config(plan, cuda=cuda)
    ds = parsed(config)
    assert ds.train_batch_size == 8
    assert ds.train_micro_batch_size_per_gpu == 2
    assert ds.gradient_accumulation_steps == 4
    assert ds.zero_optimization_stage == plan.zero_stage
    assert ds.bfloat16_config.enabled == (plan.precision.value == "bf16")
    assert ds.float16_config.enabled == (plan.precision.value == "fp16")
    assert ds.gradient_clipping == 0.0


def test_offload_maps_to_optimizer_and_parameter_sections() -> None:
    zero = build_deepspeed_config(make_plan().deepspeed(3).offload("nvme", "/nvme").build(), cuda=True)[
        "zero_optimization"
    ]
    assert zero["offload_optimizer"] == {
        "device": "nvme",
        "pin_memory": True,
        "nvme_path": "/nvme",
        "buffer_count": 4,
    }
    assert zero["offload_param"]["device"] == "nvme" and zero["offload_param"]["nvme_path"] == "/nvme"
    zero2 = build_deepspeed_config(make_plan().deepspeed(2).offload("cpu").build(), cuda=False)[
        "zero_optimization"
    ]
    assert zero2["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert "offload_param" not in zero2  # parameters are offloaded at ZeRO-3 only


def test_fp16_uses_dynamic_loss_scaling() -> None:
    fp16 = build_deepspeed_config(make_plan().deepspeed(2).precision("fp16").build(), cuda=True)["fp16"]
    assert fp16["enabled"] and fp16["loss_scale"] == 0 and fp16["initial_scale_power"] == 16


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (make_plan().deepspeed(2), {"type": "AdamW", "torch_adam": True}),
        (make_plan().deepspeed(2).offload("cpu"), {"type": "AdamW", "torch_adam": None}),
        (make_plan().deepspeed(2).optimizer("adam"), {"type": "Adam", "adam_w_mode": False}),
        (make_plan().deepspeed(2).optimizer("sgd"), {"type": "SGD", "momentum": 0.9}),
        (make_plan().deepspeed(2).eight_bit(), None),
    ],
    ids=["adamw cpu", "adamw offload", "adam", "sgd", "8-bit client"],
)
def test_optimizer_section(plan: PlanBuilder, expected: dict[str, Any] | None) -> None:
    config = build_deepspeed_config(plan.build(), cuda=False)
    if expected is None:
        assert "optimizer" not in config and config["zero_allow_untested_optimizer"] is True
        return
    section = config["optimizer"]
    assert section["type"] == expected.pop("type")
    for key, value in expected.items():
        assert section["params"].get(key) == value, key


def test_buckets_follow_the_hidden_size() -> None:
    zero2 = build_deepspeed_config(make_plan().deepspeed(2).build(), cuda=True)["zero_optimization"]
    assert zero2["reduce_bucket_size"] == 64 * 64 == zero2["allgather_bucket_size"]
    zero3 = build_deepspeed_config(make_plan().deepspeed(3).build(), cuda=True)["zero_optimization"]
    assert zero3["stage3_param_persistence_threshold"] == 640


@pytest.mark.parametrize(
    ("version", "stage", "fp16", "expected"),
    [
        ("0.19.8", 0, True, True),
        ("0.19.8+cpu", 0, True, True),
        ("0.19.8", 2, True, False),
        ("0.19.8", 0, False, False),
        ("0.20.0", 0, True, False),
    ],
)
def test_zero0_fp16_loss_scaling_workaround_is_version_gated(
    version: str, stage: int, fp16: bool, expected: bool
) -> None:
    from memfit_trainer.strategies.deepspeed import zero0_fp16_needs_loss_scaling

    assert zero0_fp16_needs_loss_scaling(version, zero_stage=stage, fp16=fp16) is expected
