"""Plan: the checkpoint interval the trainer saves at (the job's pin, else the plan's choice)."""

from __future__ import annotations

from typing import Any

import pytest
from memfit.api.job import DEFAULT_CHECKPOINT_EVERY_STEPS
from memfit.api.plan import BaselineCost, Plan

MEMORY = {"parametersBytes": 0, "gradientsBytes": 0, "optimizerBytes": 0, "activationsBytes": 0,
          "temporariesBytes": 0, "overheadBytes": 0, "peakBytes": 0}


def make_plan(*, pinned: int | None, chosen: int | None) -> Plan:
    checkpoint = {} if pinned is None else {"everySteps": pinned}
    wire: dict[str, Any] = {
        "engine": "ddp", "zeroStage": 0, "precision": "fp32", "activationCheckpointing": "none", "offload": "none",
        "optimizer8bit": False, "microBatchSize": 1, "gradientAccumulationSteps": 1, "nodes": 1, "gpusPerNode": 1,
        "nodePool": "p", "gpuProduct": "cpu", "gpuMemoryBytes": 0, "memory": MEMORY, "headroomPercent": 10,
        "pricePerHour": 0, "stepSeconds": 0, "estimatedHours": 0, "estimatedCost": 0,
        "training": {"globalBatchSize": 1, "maxSteps": 10, "checkpoint": checkpoint},
    }
    if chosen is not None:
        wire["checkpointEverySteps"] = chosen
    return Plan.model_validate(wire)


INTERVALS = {
    "memfit's choice": ((None, 240), 240),
    "the job's pin wins over the plan's": ((100, 240), 100),
    "the job's pin alone": ((100, None), 100),
    "a plan from before memfit chose: the old default": ((None, None), DEFAULT_CHECKPOINT_EVERY_STEPS),
}


@pytest.mark.parametrize("case", INTERVALS, ids=list(INTERVALS))
def test_checkpoint_interval_steps(case: str) -> None:
    (pinned, chosen), expected = INTERVALS[case]
    plan = make_plan(pinned=pinned, chosen=chosen)
    assert plan.checkpoint_interval_steps == expected
    assert Plan.model_validate_json(plan.model_dump_json(by_alias=True)).checkpoint_interval_steps == expected


def test_a_chosen_interval_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="checkpointEverySteps"):
        make_plan(pinned=None, chosen=0)


@pytest.mark.parametrize(("baseline_hours", "ratio"), [(4.0, 0.5), (None, None), (0.0, None)])
def test_the_status_shows_the_wall_clock_ratio_beside_the_savings(baseline_hours: float | None,
                                                                  ratio: float | None) -> None:
    plan = make_plan(pinned=None, chosen=None).model_copy(update={
        "estimated_hours": 2.0, "estimated_cost": 1.0,
        "baseline": BaselineCost(label="plain bf16 DDP", cost_per_hour=1.0, cost=4.0, savings_percent=75.0,
                                 hours=baseline_hours)})
    summary = plan.summary()
    assert summary.savings == "saves 75%" and summary.wall_clock_ratio == ratio
