"""Which engine/stage/offload combinations can run."""

from __future__ import annotations

import pytest
from memfit.memory import Strategy, strategy_problem
from memory_factories import S

PROBLEMS = {
    "DDP cannot shard": (S().ddp()._config(zero_stage=3).build(), "DDP does not shard"),
    "DDP cannot offload": (S().ddp().offload("cpu").build(), "DDP cannot offload"),
    "FSDP has no stage 1": (S().fsdp(1).build(), "FSDP shards at stage 2"),
    "NVMe needs ZeRO-3": (S().deepspeed(2).offload("nvme").build(), "NVMe offload needs DeepSpeed ZeRO-3"),
    "NVMe is DeepSpeed only": (S().fsdp(3).offload("nvme").build(), "NVMe offload needs DeepSpeed ZeRO-3"),
    "ZeRO-0 does not offload": (S().deepspeed(0).offload("cpu").build(), "only with ZeRO stage 1, 2 or 3"),
    "8-bit cannot step on the CPU": (S().deepspeed(2).offload("cpu").eight_bit().build(), "8-bit"),
}


@pytest.mark.parametrize(("strategy", "message"), PROBLEMS.values(), ids=PROBLEMS.keys())
def test_impossible_combinations_say_why(strategy: Strategy, message: str) -> None:
    problem = strategy_problem(strategy)
    assert problem is not None and message in problem


VALID = {
    "DDP bf16": S().ddp().bf16().build(),
    "ZeRO-3 NVMe": S().deepspeed(3).offload("nvme").build(),
    "FSDP offload": S().fsdp(2).offload("cpu").build(),
    "ZeRO-1 CPU offload": S().deepspeed(1).offload("cpu").build(),
}


@pytest.mark.parametrize("strategy", VALID.values(), ids=VALID.keys())
def test_valid_combinations(strategy: Strategy) -> None:
    assert strategy_problem(strategy) is None


def test_describe() -> None:
    s = S().deepspeed(2).bf16().ckpt("full").offload("cpu").world(4).mbs(2, 8).build()
    assert s.config.describe() == "ZeRO-2 bf16 ckpt-full offload-cpu mbs 2x8"
