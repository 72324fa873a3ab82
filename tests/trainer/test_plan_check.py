"""Plans the runtime cannot honour are refused before training, with every reason named."""

from __future__ import annotations

import pytest
from memfit_trainer.plan_check import RuntimeFacts, plan_problems
from trainer_support import PlanBuilder, make_plan

CPU_1 = RuntimeFacts(world_size=1, cuda=False)
CASES: dict[str, tuple[PlanBuilder, RuntimeFacts, str]] = {
    "zero-3 with ddp": (make_plan().ddp().engine("ddp", 3), CPU_1, "ZeRO-3 with DDP"),
    "ddp cannot offload": (make_plan().ddp().offload("cpu"), CPU_1, "offload cpu with DDP"),
    "fsdp stage 1": (make_plan().fsdp(1), CPU_1, "FSDP with zeroStage 1"),
    "fsdp nvme": (make_plan().fsdp(3).offload("nvme", "/nvme"), CPU_1, "NVMe offload needs engine deepspeed"),
    "nvme without a path": (make_plan().deepspeed(3).offload("nvme"), CPU_1, "offload nvme without nvmePath"),
    "nvme at zero-2": (make_plan().deepspeed(2).offload("nvme", "/nvme"), CPU_1, "ZeRO-3 only"),
    "offload at zero-0": (make_plan().deepspeed(0).offload("cpu"), CPU_1, "offload cpu with ZeRO-0"),
    "bf16 on a T4": (
        make_plan().bf16(),
        RuntimeFacts(1, cuda=True, bf16_supported=False),
        "without bf16 support",
    ),
    "world size mismatch": (make_plan().world(2), CPU_1, "world size 2, but this job runs with world size 1"),
    "global batch mismatch": (make_plan().global_batch(6), CPU_1, "globalBatchSize is 6"),
    "unresolved auto": (make_plan().precision("auto"), CPU_1, "precision is 'auto'"),
    "nvme without async io": (
        make_plan().deepspeed(3).offload("nvme", "/nvme"),
        RuntimeFacts(1, cuda=True, async_io=False),
        "async_io",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_invalid_plan_names_the_reason(name: str) -> None:
    plan, facts, reason = CASES[name]
    problems = plan_problems(plan.build(), facts)
    assert any(reason in p for p in problems), problems


@pytest.mark.parametrize(
    "plan",
    [
        make_plan().ddp().bf16().ckpt("selective").eight_bit(),
        make_plan().fsdp(2).offload("cpu"),
        make_plan().deepspeed(3).offload("nvme", "/nvme"),
        make_plan().deepspeed(1).offload("cpu").eight_bit(),
        make_plan().fsdp(3).precision("fp16"),
    ],
    ids=["ddp", "fsdp2-offload", "ds3-nvme", "ds1-offload-8bit", "fsdp3-fp16"],
)
def test_valid_plans_pass(plan: PlanBuilder) -> None:
    assert plan_problems(plan.build(), RuntimeFacts(world_size=1, cuda=True)) == []


def test_fp16_is_accepted_on_cpu() -> None:
    """fp16 with loss scaling runs on CPU too (slowly), so CPU stand-ins for GPU pods can run fp16 plans."""
    assert plan_problems(make_plan().deepspeed(2).precision("fp16").build(), CPU_1) == []
