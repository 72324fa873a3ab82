"""Spot priced as risk: expected hours with lost work and restarts, and the pool choice it changes."""

from __future__ import annotations

import math
from typing import Any

import pytest
from memfit.api.validation import validate_document
from memfit.catalog import CATALOG
from memfit.planner import plan
from memfit.planner.interruptions import RESTART_SECONDS, expected_hours, interruption_risk
from memfit.planner.offers import Offer, resolve_offer
from planner_factories import make_job, make_pool

RESTART_HOURS = RESTART_SECONDS / 3600
RISK = {
    # (hours, step seconds, rate per node-hour, nodes, checkpoint every steps) -> expected hours
    "on-demand: no risk": ((10.0, 1.0, 0.0, 1, None), 10.0),
    "checkpoint every hour": ((10.0, 1.0, 0.05, 1, 3600), 10.0 / (1 - 0.05 * (0.5 + RESTART_HOURS))),
    "two nodes: twice the rate": ((10.0, 1.0, 0.05, 2, 3600), 10.0 / (1 - 0.1 * (0.5 + RESTART_HOURS))),
    "no persistent checkpoint: half the run lost": ((4.0, 1.0, 0.05, 1, None), 4.0 / (1 - 0.05 * (2 + RESTART_HOURS))),
    "checkpoint interval longer than the run": ((1.0, 10.0, 0.05, 1, 10_000), 1.0 / (1 - 0.05 * (0.5 + RESTART_HOURS))),
    "interruptions faster than the work is saved": ((50.0, 1.0, 0.05, 1, None), math.inf),
}


@pytest.mark.parametrize("case", RISK, ids=list(RISK))
def test_expected_hours(case: str) -> None:
    (hours, seconds, rate, nodes, every), expected = RISK[case]
    got = expected_hours(hours=hours, step_seconds=seconds, rate_per_node_hour=rate, nodes=nodes,
                         checkpoint_every_steps=every)
    assert got == pytest.approx(expected)
    risk = interruption_risk(hours=hours, step_seconds=seconds, rate_per_node_hour=rate, nodes=nodes,
                             checkpoint_every_steps=every)
    assert risk.expected_hours == pytest.approx(expected)


def test_the_pool_rate_overrides_the_catalog_default_of_its_capacity_type() -> None:
    spot = resolve_offer(make_pool("s", "l4", capacityType="spot"), catalog=CATALOG)
    own = resolve_offer(make_pool("o", "l4", capacityType="spot", interruptionRatePerHour=0.5), catalog=CATALOG)
    on_demand = resolve_offer(make_pool("d", "l4"), catalog=CATALOG)
    assert isinstance(spot, Offer) and isinstance(own, Offer) and isinstance(on_demand, Offer)
    assert (spot.interruption_rate_per_hour, own.interruption_rate_per_hour, on_demand.interruption_rate_per_hour) == (
        CATALOG.interruption_rate("spot"), 0.5, 0.0)
    assert CATALOG.interruption_rate("spot") > 0 == CATALOG.interruption_rate("reserved")


def spot_job(*, steps: int, checkpoint: dict[str, Any] | None = None) -> Any:
    job = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).steps(steps)
    if checkpoint is not None:
        job.spec["training"]["checkpoint"] = checkpoint
    return job.build()


def pools(rate: float) -> list[Any]:
    return [make_pool("l4-spot", "l4", price=0.35, capacityType="spot", interruptionRatePerHour=rate),
            make_pool("l4", "l4", price=0.805)]


def test_on_demand_wins_when_spot_interruptions_cost_more_and_the_plan_says_why() -> None:
    job = spot_job(steps=20_000, checkpoint={"emptyDir": True})  # about 3.3 h on an L4, no persistent checkpoint
    calm = plan(job, pools=pools(0.0), catalog=CATALOG)
    assert calm.chosen is not None and calm.chosen.pool == "l4-spot"
    hours = calm.chosen.hours
    # A rate at which spot's expected hours are 3x: dearer than on-demand's 2.3x price.
    rate = (2 / 3) / (hours / 2 + RESTART_HOURS)
    risky = plan(job, pools=pools(rate), catalog=CATALOG)
    assert risky.chosen is not None and risky.chosen.pool == "l4"
    assert risky.plan is not None
    (note,) = [n for n in risky.plan.cost_notes if n.startswith("not l4-spot")]
    assert f"${0.35 * hours:.2f} uninterrupted but ${0.35 * hours * 3:.2f} expected" in note
    assert "no persistent checkpoint" in note and f"more than ${risky.chosen.total_cost:.2f} here" in note
    # The baseline runs on the same pools with the same risk: plain DDP moves to on-demand as well.
    assert risky.baseline is not None and risky.baseline.pool == "l4"


@pytest.mark.parametrize("checkpoint", [{"volumeClaim": "ckpt", "everySteps": 100}, {"everySteps": 100}],
                         ids=["named claim", "the operator's default claim"])
def test_checkpoints_on_a_volume_make_spot_cheap_again_and_its_risk_is_in_the_cost(checkpoint: dict[str, Any]) -> None:
    job = spot_job(steps=20_000, checkpoint=checkpoint)
    calm = plan(job, pools=pools(0.0), catalog=CATALOG)
    assert calm.chosen is not None
    rate = (2 / 3) / (calm.chosen.hours / 2 + RESTART_HOURS)
    risky = plan(job, pools=pools(rate), catalog=CATALOG)
    assert risky.chosen is not None and risky.chosen.pool == "l4-spot" and risky.plan is not None
    assert risky.chosen.total_cost > calm.chosen.total_cost  # lost work and restarts are priced in
    (note,) = [n for n in risky.plan.cost_notes if n.startswith("interruptions priced as risk")]
    assert "checkpoints every 100 steps" in note and f"= ${risky.chosen.total_cost:.2f}" in note


def test_a_spot_pool_where_the_run_would_never_finish_is_rejected_with_the_reason() -> None:
    result = plan(spot_job(steps=200_000, checkpoint={"emptyDir": True}), pools=pools(0.5)[:1], catalog=CATALOG)
    assert result.plan is None
    assert "no run on it would finish" in result.message()
    assert "at 0.5 interruptions per node-hour (spot)" in result.message()
    assert "keep checkpoints on a claim instead of an emptyDir" in result.message()


@pytest.mark.parametrize("value", [-0.1, 101, "often"])
def test_interruption_rate_is_validated_with_its_field_path(value: object) -> None:
    doc = {"apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool", "metadata": {"name": "p"},
           "spec": {"gpu": {"product": "l4"}, "interruptionRatePerHour": value}}
    loaded, problems = validate_document(doc, "pools.yaml")
    assert loaded is None
    assert [p.path for p in problems] == ["spec.interruptionRatePerHour"]
